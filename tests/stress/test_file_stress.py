"""File stress (issue 20, "the stress suite we keep"): processes hammering one capped folder while
they are killed with SIGKILL, and entries damaged in every way a file can be under the callers.
Every call must return the right value (from the folder or recomputed): 0 wrong values,
0 exceptions to the caller; the folder stays within its cap plus the entries being written; no
dead writer's temporary file outlives one eviction pass; no killed writer leaves a damaged entry.

Damage is done as another writer of the folder would do it: a whole file (or link, FIFO, folder)
renamed into an entry's place. Truncating a file in place under a process that maps it kills
that process with SIGBUS; the folder's owner check is the defence against that (see
docs/security.md), so it is not a scenario here (``tests/backends/test_file_limits.py`` checks
that arrowstash itself never does it).

Quick by default (a few seconds a scenario, what CI runs); ``ARROWSTASH_STRESS=full`` runs each
scenario for a minute. The module prints one table of what every scenario measured.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pytest
import xxhash

import arrowstash
from _stress_table import print_table
from arrowstash import FileBackend
from arrowstash.backends._file_io import TEMP_FOLDER
from arrowstash.entry.format import ALIGN, HEADER, Key, entry_bytes, parse_entry
from arrowstash.errors import CorruptEntryError
from arrowstash.serializers.standard import StandardSerializer

pytestmark = pytest.mark.slow

FULL = os.environ.get("ARROWSTASH_STRESS") == "full"
SECONDS = 60.0 if FULL else 4.0
WORKERS = 6
KILL_EVERY = 0.4  # a random worker is killed (SIGKILL) and replaced this often
THREADS = 3
KEYS = 48
CAP = 6 << 20
MAP_FROM = 64 << 10  # entries from this size are read through a memory map
MAX_ENTRY = 1_300_000  # the largest value's entry, about: the slack the cap allows per writer
ROWS: list[dict[str, Any]] = []


def expected(x: int) -> Any:
    """The value of key ``x``: arrays and frames (most of them mapped when read) and dicts."""
    if x % 4 == 0:
        return np.arange(20_000 + 3_000 * x, dtype=np.float64)
    if x % 4 == 1:
        n = 2_000 + 500 * x
        return pd.DataFrame({"i": np.arange(n), "s": [f"r{x}"] * n})
    return {"x": x, "square": x * x, "text": f"value {x}" * (x % 7)}


def same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and np.array_equal(got, want)
    if isinstance(want, pd.DataFrame):
        return isinstance(got, pd.DataFrame) and bool(got.equals(want))
    return bool(got == want)


def cached(backend: FileBackend, **options: Any) -> Callable[[int], Any]:
    """The function every worker calls: one name, so one set of keys for all processes."""

    @arrowstash.cache(backend=backend, l1=False, **options)
    def compute(x: int) -> Any:
        return expected(x)

    return compute


@dataclass
class Tally:
    calls: int = 0
    errors: int = 0
    wrong: list[str] = field(default_factory=list)
    escaped: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, fn: Callable[[int], Any], x: int) -> bool:
        """Call ``fn(x)`` and count it; whether something went wrong (worth reporting now)."""
        try:
            ok = same(fn(x), expected(x))
        except Exception as exc:  # counted: the test requires none
            with self.lock:
                self.escaped.append(f"{x}: {exc!r}"[:200])
            return True
        with self.lock:
            self.calls += 1
            if not ok:
                self.wrong.append(f"key {x}")
        return not ok


# -- processes killed while they write ----------------------------------------------------------


def _report(path: str, tally: Tally, errors: int) -> None:
    temp = f"{path}.tmp"
    with open(temp, "w") as f:
        json.dump({"calls": tally.calls, "errors": errors, "wrong": tally.wrong,
                   "escaped": tally.escaped}, f)
    os.replace(temp, path)


def _worker(folder: str, seed: int, report: str, stop: str) -> None:
    """Call the cached function on random keys until ``stop`` exists; reports its tally every
    0.1 s and at once after anything wrong (it may be killed at any moment)."""
    compute: Any = cached(FileBackend(folder, max_bytes=CAP, mmap_threshold=MAP_FROM))
    tally, rng, reported = Tally(), random.Random(seed), time.monotonic()
    while not os.path.exists(stop):
        bad = tally.call(compute, rng.randrange(KEYS))
        if bad or time.monotonic() - reported > 0.1:
            _report(report, tally, compute.cache_info().errors)
            reported = time.monotonic()
    _report(report, tally, compute.cache_info().errors)


def _files(folder: Path) -> tuple[int, int]:
    """(bytes of entries and temporary files, number of temporary files) at one moment."""
    size = temps = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            if path.name.endswith(".ast") or path.parent.name == TEMP_FOLDER:
                size += path.stat().st_size
                temps += path.parent.name == TEMP_FOLDER
    return size, temps


def test_processes_killed_while_hammering_a_capped_folder(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    FileBackend(folder, max_bytes=CAP)
    stop = tmp_path / "stop"
    # Forked: a spawned worker would spend seconds importing before its first call.
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(1)
    live: list[tuple[Any, str]] = []
    reports: list[str] = []

    def start() -> None:
        reports.append(str(tmp_path / f"report-{len(reports)}.json"))
        proc = ctx.Process(target=_worker, args=(str(folder), len(reports), reports[-1],
                                                 str(stop)))
        proc.start()
        live.append((proc, reports[-1]))

    for _ in range(WORKERS):
        start()
    peak = kills = 0
    started = last_kill = time.monotonic()
    try:
        # Sampling here rather than in a thread: no fork happens while another thread runs.
        while time.monotonic() - started < SECONDS:
            peak = max(peak, _files(folder)[0])
            time.sleep(0.002)
            if time.monotonic() < last_kill + KILL_EVERY:
                continue
            last_kill = time.monotonic()
            running = [w for w in live if os.path.exists(w[1])]  # it has made calls
            if running:
                victim = rng.choice(running)
                live.remove(victim)
                victim[0].kill()  # SIGKILL: mid-write, mid-eviction, holding the ledger...
                victim[0].join()
                kills += 1
                start()
        stop.touch()
        for proc, _ in live:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    finally:
        for proc, _ in live:
            if proc.is_alive():
                proc.kill()
    orphans_before = _files(folder)[1]
    FileBackend(folder, max_bytes=CAP).evict()  # one eviction pass
    orphans_after = _files(folder)[1]
    tallies = [json.loads(Path(r).read_text()) for r in reports if Path(r).exists()]
    tally = Tally(calls=sum(t["calls"] for t in tallies),
                  errors=sum(t["errors"] for t in tallies),
                  wrong=[w for t in tallies for w in t["wrong"]],
                  escaped=[e for t in tallies for e in t["escaped"]])
    # What the killed writers left is readable: every key, and a scrub of the whole folder.
    final = cached(FileBackend(folder, max_bytes=CAP, mmap_threshold=MAP_FROM), verify=True)
    for x in range(KEYS):
        tally.call(final, x)
    scrub = subprocess.run([sys.executable, "-m", "arrowstash", "verify", f"file://{folder}"],
                           capture_output=True, text=True, timeout=120, check=False)
    bound = CAP + WORKERS * MAX_ENTRY
    ROWS.append({"scenario": f"file: {WORKERS} processes, SIGKILL every {KILL_EVERY} s",
                 "calls": tally.calls, "killed/planted": kills, "errors": tally.errors,
                 "wrong": len(tally.wrong), "exceptions": len(tally.escaped),
                 "orphans": f"{orphans_before} -> {orphans_after}",
                 "peak MB": peak / 1e6, "cap MB": CAP / 1e6})
    assert tally.wrong == [], tally.wrong[:5]
    assert tally.escaped == [], tally.escaped[:5]
    assert tally.calls > 100
    assert orphans_after == 0
    assert scrub.returncode == 0, scrub.stdout[-2000:]
    assert peak <= bound, (peak, bound)


# -- entries damaged under the callers ----------------------------------------------------------


def _with_checksum(header: bytearray, trailer: bytes) -> bytes:
    """``header`` with the (unkeyed) checksum recomputed: the damage passes the format's check."""
    checksum = xxhash.xxh3_64()
    checksum.update(header[:48])
    checksum.update(header[56:])
    checksum.update(trailer)
    struct.pack_into("<Q", header, 48, checksum.intdigest())
    return bytes(header)


def _huge_lengths(raw: bytes) -> bytes:
    """Section lengths of 2^60 bytes in the trailer, with a valid checksum."""
    entry = parse_entry(raw, check_sections=False)
    trailer = msgpack.unpackb(raw[entry.header.trailer_at:], raw=False, strict_map_key=False)
    trailer["sec"] = [[offset, 1 << 60, digest] for offset, _, digest in trailer["sec"]]
    packed = msgpack.packb(trailer, use_bin_type=True)
    body = bytearray(raw[: entry.header.trailer_at]) + packed
    fields = list(HEADER.unpack_from(body))
    fields[4] = len(body)
    header = bytearray(HEADER.pack(*fields))
    return _with_checksum(header, packed) + bytes(body[ALIGN:])


def _huge_total(raw: bytes) -> bytes:
    """A header declaring 2^62 bytes in all, with a valid checksum."""
    entry = parse_entry(raw, check_sections=False)
    header = bytearray(raw[:ALIGN])
    struct.pack_into("<Q", header, 16, 1 << 62)
    return _with_checksum(header, raw[entry.header.trailer_at:]) + raw[ALIGN:]


def _forged(key: Key) -> bytes:
    """A well-formed entry of the wrong value (only a secret can tell it from a real one)."""
    return bytes(entry_bytes(key, StandardSerializer().encode({"forged": True}),
                             created=time.time(), expires=None))


DAMAGE = ["flip", "truncate", "random", "fifo", "symlink", "folder", "sparse", "huge-lengths",
          "huge-total", "forged"]


def _damage(path: Path, kind: str, rng: random.Random, key: Key, outside: Path) -> bool:
    """Put a damaged version of the entry at ``path`` in its place; whether one was planted."""
    try:  # the vandal reads only entries, not what it planted (a FIFO, a sparse TiB...)
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > 16 * MAX_ENTRY:
            return False
        raw = path.read_bytes()
    except OSError:
        return False
    temp = path.with_name(f"{path.name}.{rng.randrange(1 << 30)}.vandal")
    if kind == "flip" and len(raw) > ALIGN:
        at = rng.randrange(ALIGN, len(raw))
        temp.write_bytes(raw[:at] + bytes([raw[at] ^ (1 << rng.randrange(8))]) + raw[at + 1:])
    elif kind == "truncate" and raw:
        temp.write_bytes(raw[: rng.randrange(len(raw))])
    elif kind == "random":
        temp.write_bytes(os.urandom(rng.randrange(1, 200_000)))
    elif kind == "fifo":
        os.mkfifo(temp)
    elif kind == "symlink":
        temp.symlink_to(rng.choice([outside, Path("/dev/zero"), path.parent]))
    elif kind == "folder":
        temp.mkdir()
    elif kind == "sparse" and raw:  # the entry, then a hole up to 1 TiB
        temp.write_bytes(raw)
        os.truncate(temp, 1 << 40)
    elif kind in ("huge-lengths", "huge-total"):
        try:
            temp.write_bytes((_huge_lengths if kind == "huge-lengths" else _huge_total)(raw))
        except CorruptEntryError:  # damaged already: nothing to take lengths from
            return False
    elif kind == "forged":
        temp.write_bytes(_forged(key))
    else:
        return False
    try:
        if kind == "folder":  # a folder cannot replace a file: the file goes first
            path.unlink()
        os.replace(temp, path)  # as a writer of the folder would: into place, never in place
    except OSError:  # a caller replaced the entry meanwhile, or made its place a folder
        with contextlib.suppress(OSError):
            temp.rmdir() if kind == "folder" else temp.unlink()
        return False
    return True


def _vandalise(folder: Path, stop: threading.Event, kinds: list[str],
               planted: dict[str, int]) -> None:
    rng = random.Random(7)
    outside = folder.parent / "outside.ast"
    outside.write_bytes(os.urandom(5000))
    while not stop.is_set():
        paths = [p for p in folder.rglob("*.ast") if TEMP_FOLDER not in p.parts]
        for path in rng.sample(paths, min(3, len(paths))):
            if path.is_dir() and not path.is_symlink():  # a planted folder: callers cannot
                with contextlib.suppress(OSError):     # replace it, so it goes in a while
                    path.rmdir()
                continue
            kind = rng.choice(kinds)
            key = Key("default", f"{cached.__module__}.cached.<locals>.compute",
                      bytes.fromhex(path.name.removesuffix(".ast")))
            if _damage(path, kind, rng, key, outside):
                planted[kind] = planted.get(kind, 0) + 1
        time.sleep(0.01)


def _hammer_threads(compute: Callable[[int], Any], seconds: float) -> Tally:
    tally, stop = Tally(), threading.Event()

    def loop(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            tally.call(compute, rng.randrange(KEYS))

    threads = [threading.Thread(target=loop, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return tally


@pytest.mark.parametrize("secret", [None, b"stress"], ids=["no-secret", "secret"])
def test_entries_damaged_in_every_way_under_the_callers(tmp_path: Path, secret: bytes | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a secret every kind of damage but a forgery must be caught (a well-formed entry
    of another value is indistinguishable from a real one); with one, forgeries too. Mapped
    entries are checked with ``verify=True``: by default a map is read without hashing it."""
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    folder = tmp_path / "cache"
    kinds = DAMAGE if secret else [k for k in DAMAGE if k != "forged"]
    compute: Any = cached(FileBackend(folder, max_bytes=CAP, mmap_threshold=MAP_FROM),
                          verify=True, secret=secret)
    for x in range(KEYS):
        compute(x)
    stop, planted = threading.Event(), {}
    vandal = threading.Thread(target=_vandalise, args=(folder, stop, kinds, planted))
    vandal.start()
    started = time.monotonic()
    try:
        tally = _hammer_threads(compute, SECONDS)
    finally:
        stop.set()
        vandal.join()
    slowest = time.monotonic() - started - SECONDS
    total = sum(planted.values())
    ROWS.append({"scenario": f"file: damaged entries, {'secret' if secret else 'no secret'}",
                 "calls": tally.calls, "killed/planted": total,
                 "errors": compute.cache_info().errors, "wrong": len(tally.wrong),
                 "exceptions": len(tally.escaped), "orphans": "-", "peak MB": "-",
                 "cap MB": CAP / 1e6})
    assert tally.wrong == [], tally.wrong[:5]
    assert tally.escaped == [], tally.escaped[:5]
    assert set(planted) == set(kinds), planted  # every kind was met at least once
    assert tally.calls > total > 20
    assert compute.cache_info().errors > 0  # damage was met and logged, not served
    assert slowest < 5.0  # no call hung (the threads were joined this long after the stop)


@pytest.fixture(scope="module", autouse=True)
def table(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_table(request, ["scenario", "calls", "killed/planted", "errors", "wrong", "exceptions",
               "orphans", "peak MB", "cap MB"], ROWS, digits=1)
