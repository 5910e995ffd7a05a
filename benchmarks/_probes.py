"""Measurement helpers: page recycling (bench_frames.py, bench_arrays.py), and measurements in
child processes for bench_frames.py: peak RSS and callgrind counts.

The children are started as ``python bench_frames.py --_rss ...`` / ``--_cg ...``, which call
``rss_child`` / ``cg_child`` here with that script's ``make`` (a contender by name, in a folder)
and ``load`` (a frame by source).
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

Make = Callable[[str, Path], Any]
Load = Callable[[str], Any]


# -- pages ------------------------------------------------------------------------------------


def prefault(scratch: Path, nbytes: int) -> None:
    """Write and delete a scratch file of ``nbytes``. On this VM, memory the guest leaves free
    for a few seconds goes back to the host and costs a host page fault per page when next
    allocated (a 1 GiB write into the page cache after 6 s idle: ~3 s instead of ~0.25 s),
    which would charge whichever contender happens to run after an idle spell. Recycling warm
    pages first puts every timed operation on the same footing."""
    chunk = bytes(16 << 20)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(-(-nbytes // len(chunk))):
            os.write(fd, chunk)
    finally:
        os.close(fd)
        os.unlink(scratch)


# -- peak RSS ---------------------------------------------------------------------------------

def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(field + ":"))


def _peak(fn: Callable[[], Any]) -> int:
    """Bytes the high-water mark rose above the RSS just before ``fn()``, its result alive."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = _status("VmRSS")
    value = fn()
    peak = _status("VmHWM") - base
    del value
    return peak


def rss_child(make: Make, load: Load, name: str, source: str, folder: str) -> None:
    df = load(source)
    c = make(name, Path(folder))
    # imports and first calls outside the measurement: enough rows that a compressed store
    # takes the packed path and starts its worker threads, as any later store finds them
    c.store(df.head(20_000))
    for fmt in c.formats:
        c.hit(fmt)
    c.clear()
    out = {"store": _peak(lambda: c.store(df))}
    for fmt in c.formats:
        out[fmt] = _peak(lambda fmt=fmt: c.hit(fmt))
    c.close()
    print(json.dumps(out))


def peak_rss(script: str, names: list[str], source: str, root: Path) -> dict[str, Any]:
    """{contender: {"store": bytes, format: bytes}}, each from a fresh process."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        print("peak RSS skipped: /proc/self/clear_refs is not writable (needs root)")
        return {}

    def run(i: int) -> Any:
        cmd = [sys.executable, script, "--_rss", names[i], source, str(root / f"rss{i}")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        shutil.rmtree(root / f"rss{i}", ignore_errors=True)
        if done.returncode:
            print(f"peak RSS of {names[i]} failed: {done.stderr.strip().splitlines()[-1:]}")
            return None
        return json.loads(done.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time: each peak is its own
        peaks = dict(zip(names, pool.map(run, range(len(names))), strict=True))
    return {name: peak for name, peak in peaks.items() if peak is not None}


# -- callgrind --------------------------------------------------------------------------------

CG_NAMES = ("arrowstash none", "arrowstash zstd", "cachekit zstd", "cachekit none")
PAIRS = (("arrowstash none", "cachekit zstd"), ("arrowstash zstd", "cachekit zstd"),
         ("arrowstash none", "cachekit none"))  # default vs default, then like for like
HELPER = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""


def cg_child(make: Make, load: Load, name: str, source: str, folder: str, warm: int, k: int,
             helper: str) -> None:
    """``warm`` round trips (store, then pandas hit), then ``k`` more, the only ones
    instrumented if there is a helper (else the whole run is, and a run with k=0 subtracted)."""
    df = load(source)
    c = make(name, Path(folder) / "cache")
    lib = ctypes.CDLL(helper) if helper else None
    for arg in range(warm + k):
        if arg == warm and lib:
            lib.cg_start()
        c.store(df, arg)
        c.hit("pandas", arg)
    if lib:
        lib.cg_stop()


def _valgrind(script: str, job: tuple, folder: Path, k: int, helper: str
              ) -> tuple[int, int] | str:
    """(calling thread, all threads) instructions of a child, or why there are none."""
    name, source, warm, limit = job
    folder.mkdir(parents=True)
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes",
           f"--callgrind-out-file={folder}/cg.out", *(["--instr-atstart=no"] if helper else []),
           sys.executable, script, "--_cg", name, source, str(folder), str(warm), str(k), helper]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return f"timed out after {limit:.0f} s"
    if done.returncode:
        return "failed: " + " ".join(done.stderr.strip().splitlines()[-1:])
    per_thread = {}  # thread number (1 = the calling thread): the "totals:" of its dump
    for path in folder.glob("cg.out-*"):
        per_thread[int(path.name.rsplit("-", 1)[1])] = sum(
            int(ln.split()[1]) for ln in path.read_text(errors="replace").splitlines()
            if ln.startswith("totals:"))
    return per_thread.get(1, 0), sum(per_thread.values())


def callgrind(script: str, root: Path, small: dict[str, str], quick: bool) -> None:
    """Instructions per round trip of the ``small`` frames (label: pickle) and of flights."""
    if shutil.which("valgrind") is None:
        return print("\ncallgrind skipped: valgrind is not installed")
    helper = ""
    if shutil.which("cc"):
        (root / "cg.c").write_text(HELPER)
        built = subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(root / "cg.so"),
                                str(root / "cg.c")], capture_output=True)
        helper = str(root / "cg.so") if built.returncode == 0 else ""
    names = [n for n in CG_NAMES if importlib.util.find_spec(n.split()[0])]
    plan = {label: (path, 20, 20, 300.0) for label, path in small.items()}
    plan["flights"] = ("flights", 2, 1 if quick else 2, 600.0)

    def run(item: tuple[str, str]) -> tuple[int, int] | str:
        name, ds = item
        source, warm, k, limit = plan[ds]
        folder = root / f"cg-{names.index(name)}-{list(plan).index(ds)}"
        measured = _valgrind(script, (name, source, warm, limit), folder, k, helper)
        if helper or isinstance(measured, str):
            return measured if isinstance(measured, str) else (measured[0] // k, measured[1] // k)
        base = _valgrind(script, (name, source, warm, limit), folder.with_name(folder.name + "b"),
                         0, "")
        if isinstance(base, str):
            return base
        return (measured[0] - base[0]) // k, (measured[1] - base[1]) // k

    items = [(n, ds) for ds in plan for n in names]
    with ThreadPoolExecutor(max_workers=2) as pool:  # instruction counts ignore the load
        counts = dict(zip(items, pool.map(run, items), strict=True))
    how = "client requests around the measured trips" if helper else "run minus warm-up-only run"
    print(f"\n### Callgrind: instructions per round trip (store + pandas hit), {how}\n\n"
          "| contender | " + " | ".join(f"{ds}: calling thread | all threads" for ds in plan)
          + " |\n|---|" + "---:|---:|" * len(plan))
    for name in names:
        cells = [counts[(name, ds)] for ds in plan]
        print(f"| {name} | " + " | ".join(" | ".join(f"{v / 1e6:,.2f} M" for v in c)
                                          if isinstance(c, tuple) else f"{c} | —"
                                          for c in cells) + " |")
    print("\ncachekit's 100-row round trip was measured at 2.15 M; the target is at most half:")
    for ds in small:
        for ours, peer in PAIRS:
            a, b = counts.get((ours, ds)), counts.get((peer, ds))
            if isinstance(a, tuple) and isinstance(b, tuple):
                print(f"- {'PASS' if a[0] <= b[0] / 2 else 'FAIL'} {ds}, calling thread, "
                      f"{ours} / {peer}: {a[0] / b[0]:.2f}x (target <= 0.5x)")
