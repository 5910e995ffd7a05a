"""Measurement for bench_avro.py: wall and CPU time of contenders run interleaved, and
instruction counts from callgrind in child processes.

CPU time is ``time.process_time()`` (every thread of the process), so a contender that keeps
two cores busy to finish sooner is charged for both. Callgrind counts the instructions of every
thread between two client requests (a small C helper built here with the system's compiler and
valgrind's header): they do not move with the machine's load, which wall time does.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _order import shuffled_rounds

HELPER = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(const char *name) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(name); }
"""


@dataclass(frozen=True)
class Timing:
    """Medians over the rounds of one contender, seconds per call."""

    wall: float
    cpu: float


Result = Timing | str  # a timing, or why the contender could not run


def failure(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:70]}"


def quiet_call(fn: Callable[[], Any]) -> tuple[Any, str]:
    """``fn()`` with fd 2 sent to /dev/null (a Rust panic prints its backtrace there before it
    surfaces as a BaseException), and why it failed ("" if it did not)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        return fn(), ""
    except BaseException as exc:  # pyruhvro panics with PanicException, a BaseException
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None, failure(exc)
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def interleaved(contenders: dict[str, Callable[[], Any]], rounds: int, pause: float = 0.0
                ) -> dict[str, Result]:
    """Median wall and CPU seconds per contender, one call each per round in a shuffled order
    (after one untimed call each, which also finds the contenders that cannot run); with
    ``pause``, the process sleeps that many seconds (untimed) before each call, as a consumer
    waits between polls."""
    failed = {}
    for name, fn in contenders.items():
        _, why = quiet_call(fn)
        if why:
            failed[name] = why
    names = [n for n in contenders if n not in failed]
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for order in shuffled_rounds(names, rounds):
        for name in order:
            if pause:
                time.sleep(pause)
            wall, cpu = time.perf_counter(), time.process_time()
            contenders[name]()
            cpus[name].append(time.process_time() - cpu)
            walls[name].append(time.perf_counter() - wall)
    out: dict[str, Result] = {}
    for name in contenders:
        out[name] = failed.get(name) or Timing(statistics.median(walls[name]),
                                               statistics.median(cpus[name]))
    return out


# -- callgrind --------------------------------------------------------------------------------

def build_helper(folder: Path) -> str:
    """Path of the client-request helper, or "" where valgrind or a compiler is missing."""
    if not (shutil.which("valgrind") and shutil.which("cc")
            and Path("/usr/include/valgrind/callgrind.h").exists()):
        return ""
    (folder / "cg.c").write_text(HELPER)
    built = subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(folder / "cg.so"),
                            str(folder / "cg.c")], capture_output=True)
    return str(folder / "cg.so") if built.returncode == 0 else ""


def count_child(contenders: dict[str, Callable[[], Any]], helper: str) -> None:
    """In the child under callgrind: each contender once untimed, then once between the client
    requests, dumped under its name."""
    lib = ctypes.CDLL(helper)
    lib.cg_stop.argtypes = [ctypes.c_char_p]
    for name, fn in contenders.items():
        _, why = quiet_call(fn)
        if why:
            continue
        lib.cg_start()
        fn()
        lib.cg_stop(name.encode())


def run_counts(argv: list[str], folder: Path, timeout: float) -> dict[str, int] | str:
    """{contender: instructions over all threads} of ``python argv`` under callgrind, from the
    dumps ``count_child`` makes, or why there are none."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           f"--callgrind-out-file={folder}/cg.out", sys.executable, *argv]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if done.returncode:
        return "failed: " + " ".join(done.stderr.strip().splitlines()[-1:])
    counts = {}
    for path in folder.glob("cg.out*"):
        text = path.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and total:
            counts[trigger.group(1).strip()] = int(total.group(1))
    return counts
