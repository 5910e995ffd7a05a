"""Concurrency of the File backend and ``@cache``: real files, real processes and threads.

The multi-process tests start their workers with the ``spawn`` start method or as
``sys.executable -c`` subprocesses, line them up on a barrier or a start file, and have them report
back counts and failures; nothing is mocked.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import multiprocessing
import os
import queue as queue_module
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import arrowstash
from arrowstash import FileBackend, StandardSerializer
from arrowstash.entry.format import EntryWriter, Key, parse_entry
from arrowstash.errors import CorruptEntryError

MMAP_THRESHOLD = 4096
HAMMER_SECONDS = 3.0
HAMMER_MAX_LOOPS = 200_000
HAMMER_KEYS = 6
# Payload lengths: the smaller ones are read in, the larger ones (each item of a writer's ``n`` is
# a 5-byte MessagePack int32) give entries above MMAP_THRESHOLD, read through a memory map.
HAMMER_SIZES = (1, 7, 100, 700, 1000, 3000)
SUBPROCESS_TIMEOUT = 60.0


def _hammer_key(index: int) -> Key:
    return Key("hammer", "tests.payload", index.to_bytes(2, "big") * 8)


def _payload(writer: int, iteration: int, key_index: int) -> dict[str, Any]:
    n = (writer + 1) * 1_000_000 + iteration  # never fits in 2 bytes: every item packs to 5
    k = HAMMER_SIZES[(iteration * 7 + writer) % len(HAMMER_SIZES)]
    return {"w": writer, "i": iteration, "key": key_index, "n": n, "k": k, "data": [n] * k,
            "sum": n * k}


def _check_payload(value: Any, key_index: int) -> str | None:
    """Why ``value`` is not a whole payload written for ``key_index``, or None if it is."""
    if not isinstance(value, dict):
        return f"not a dict: {type(value).__name__}"
    try:
        n, k, data = value["n"], value["k"], value["data"]
        if value["key"] != key_index:
            return f"payload of key {value['key']} read under key {key_index}"
        if n != (value["w"] + 1) * 1_000_000 + value["i"]:
            return f"n={n} does not match writer {value['w']} iteration {value['i']}"
        if k != HAMMER_SIZES[(value["i"] * 7 + value["w"]) % len(HAMMER_SIZES)]:
            return f"unexpected length {k} for iteration {value['i']}"
        if len(data) != k or any(item != n for item in data) or value["sum"] != n * k:
            return f"inconsistent payload: n={n} k={k} len={len(data)} sum={value['sum']}"
    except (KeyError, TypeError) as exc:
        return f"malformed payload: {exc!r}"
    return None


def _hammer_writer(directory: str, writer: int, barrier: Any, queue: Any) -> None:
    counts = {"role": "writer", "id": writer, "sets": 0, "deletes": 0, "mapped_sized": 0,
              "failures": []}
    try:
        backend = FileBackend(directory, mmap_threshold=MMAP_THRESHOLD)
        serializer = StandardSerializer()
        barrier.wait(timeout=SUBPROCESS_TIMEOUT)
        deadline = time.monotonic() + HAMMER_SECONDS
        for i in range(HAMMER_MAX_LOOPS):
            if time.monotonic() >= deadline:
                break
            key_index = (i + writer) % HAMMER_KEYS
            key = _hammer_key(key_index)
            if i % 11 == 10:
                backend.delete(key)
                counts["deletes"] += 1
                continue
            size = backend.set(EntryWriter(key, serializer.encode(_payload(writer, i, key_index)),
                               time.time(), None))
            counts["sets"] += 1
            counts["mapped_sized"] += size >= MMAP_THRESHOLD
    except BaseException as exc:  # reported, not swallowed: the parent asserts on failures
        counts["failures"].append(f"writer {writer}: {exc!r}")
    queue.put(counts)


def _hammer_reader(directory: str, reader: int, barrier: Any, queue: Any) -> None:
    counts = {"role": "reader", "id": reader, "gets": 0, "misses": 0, "hits": 0, "mapped": 0,
              "unmapped": 0, "failures": []}
    last_seen: dict[tuple[int, int], int] = {}  # (key, writer) -> newest iteration read
    try:
        # One reader also refreshes recency (the LRU utime path) as a capped backend does.
        max_bytes = 1 << 30 if reader % 2 else None
        backend = FileBackend(directory, mmap_threshold=MMAP_THRESHOLD, max_bytes=max_bytes)
        serializer = StandardSerializer()
        barrier.wait(timeout=SUBPROCESS_TIMEOUT)
        deadline = time.monotonic() + HAMMER_SECONDS
        for i in range(HAMMER_MAX_LOOPS):
            if time.monotonic() >= deadline:
                break
            key_index = (i * 5 + reader) % HAMMER_KEYS
            key = _hammer_key(key_index)
            counts["gets"] += 1
            stored = backend.get(key)
            if stored is None:
                counts["misses"] += 1
                continue
            counts["hits"] += 1
            counts["mapped" if stored.mapped else "unmapped"] += 1
            try:
                # Hash the sections of mapped reads too: a torn file would show up here.
                entry = parse_entry(stored.data, check_sections=True)
                if entry.key != key:
                    raise CorruptEntryError(f"entry of {entry.key} read under {key}")
                if entry.header.total != stored.data.nbytes:
                    raise CorruptEntryError("header total differs from the bytes read")
                value = serializer.decode(entry.meta, entry.sections)
            except CorruptEntryError as exc:
                problem: str | None = f"corrupt entry: {exc}"
            else:
                problem = _check_payload(value, key_index)
                if problem is None:
                    # One writer writes one key in order and nothing rewrites a file in place,
                    # so a reader can never see an older version from the same writer again.
                    seen = (key_index, value["w"])
                    if value["i"] < last_seen.get(seen, -1):
                        problem = (f"went back in time: writer {value['w']} iteration "
                                   f"{value['i']} after {last_seen[seen]}")
                    last_seen[seen] = value["i"]
            if problem is not None and len(counts["failures"]) < 20:
                counts["failures"].append(f"reader {reader}, key {key_index}: {problem}")
            counts.setdefault("bad", 0)
            counts["bad"] += problem is not None
    except BaseException as exc:
        counts["failures"].append(f"reader {reader}: {exc!r}")
    queue.put(counts)


def _hammer_evictor(directory: str, max_bytes: int, barrier: Any, queue: Any) -> None:
    counts = {"role": "evictor", "id": 0, "evictions": 0, "removed": 0, "failures": []}
    try:
        backend = FileBackend(directory, max_bytes=max_bytes, mmap_threshold=MMAP_THRESHOLD)
        barrier.wait(timeout=SUBPROCESS_TIMEOUT)
        deadline = time.monotonic() + HAMMER_SECONDS
        for _ in range(HAMMER_MAX_LOOPS):
            if time.monotonic() >= deadline:
                break
            counts["removed"] += backend.evict()
            counts["evictions"] += 1
            time.sleep(0.002)
    except BaseException as exc:
        counts["failures"].append(f"evictor: {exc!r}")
    queue.put(counts)


@pytest.mark.slow
def test_hammer_writers_readers_evictor_never_see_torn_entries(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    FileBackend(directory)  # create the folder before the workers race to
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    writers, readers = 2, 2
    barrier = ctx.Barrier(writers + readers + 1)
    procs = [ctx.Process(target=_hammer_writer, args=(directory, w, barrier, queue))
             for w in range(writers)]
    procs += [ctx.Process(target=_hammer_reader, args=(directory, r, barrier, queue))
              for r in range(readers)]
    procs.append(ctx.Process(target=_hammer_evictor, args=(directory, 16 << 10, barrier, queue)))
    for p in procs:
        p.start()
    reports = []
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT + HAMMER_SECONDS
    try:
        # A worker killed by a signal (say SIGBUS from a mapped file shrinking) never reports:
        # stop waiting once every worker has exited, and let the exit codes tell.
        while len(reports) < len(procs) and time.monotonic() < deadline:
            try:
                reports.append(queue.get(timeout=0.2))
            except queue_module.Empty:
                if not any(p.is_alive() for p in procs):
                    with contextlib.suppress(queue_module.Empty):
                        while True:
                            reports.append(queue.get(timeout=0.5))
                    break
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert len(reports) == len(procs)

    failures = [f for report in reports for f in report["failures"]]
    assert failures == []
    by_role: dict[str, list[dict[str, Any]]] = {}
    for report in reports:
        by_role.setdefault(report["role"], []).append(report)
    assert len(by_role["writer"]) == writers and len(by_role["reader"]) == readers

    assert sum(r.get("bad", 0) for r in by_role["reader"]) == 0
    hits = sum(r["hits"] for r in by_role["reader"])
    assert hits > 0, by_role["reader"]
    # Both read paths were exercised under contention: read-in and memory-mapped entries.
    assert sum(r["mapped"] for r in by_role["reader"]) > 0, by_role["reader"]
    assert sum(r["unmapped"] for r in by_role["reader"]) > 0, by_role["reader"]
    assert all(w["sets"] > 0 and w["mapped_sized"] > 0 for w in by_role["writer"])
    # The evictor really deleted entries while they were being written and read.
    assert by_role["evictor"][0]["removed"] > 0, by_role["evictor"]

    # What is left behind is still whole, and no writer's temporary file was left over.
    backend = FileBackend(directory, mmap_threshold=MMAP_THRESHOLD)
    serializer = StandardSerializer()
    for key_index in range(HAMMER_KEYS):
        stored = backend.get(_hammer_key(key_index))
        if stored is not None:
            entry = parse_entry(stored.data)
            value = serializer.decode(entry.meta, entry.sections)
            assert _check_payload(value, key_index) is None
    assert [p for p in Path(directory).rglob("*.tmp")] == []


# -- cross-process stampede ---------------------------------------------------------------------

STAMPEDE_MODULE = '''
import os
import queue as queue_module
import secrets
import time

import arrowstash
from arrowstash import FileBackend

RUNS = os.environ["AST_TEST_RUNS"]


@arrowstash.cache(backend=FileBackend(os.environ["AST_TEST_CACHE"]))
def slow(x):
    fd = os.open(os.path.join(RUNS, f"{os.getpid()}-{time.time_ns()}-{secrets.token_hex(4)}"),
                 os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.close(fd)
    time.sleep(0.3)
    return {"x": x, "pid": os.getpid(), "token": secrets.token_hex(16)}
'''

STAMPEDE_WORKER = '''
import json, os, sys, time
import ast_stampede_mod as mod

ready, go = sys.argv[1], sys.argv[2]
open(ready, "x").close()
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("never told to go")
    time.sleep(0.002)
value = mod.slow(42)
print(json.dumps({"value": value, "info": mod.slow.cache_info().misses}))
'''


def _env(pythonpath: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pythonpath), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.update(extra)
    return env


@pytest.mark.slow
def test_stampede_across_processes_runs_the_body_once(tmp_path: Path) -> None:
    workers = 8
    (tmp_path / "ast_stampede_mod.py").write_text(STAMPEDE_MODULE)
    runs, sync = tmp_path / "runs", tmp_path / "sync"
    runs.mkdir()
    sync.mkdir()
    env = _env(tmp_path, AST_TEST_RUNS=str(runs), AST_TEST_CACHE=str(tmp_path / "cache"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STAMPEDE_WORKER, str(sync / f"ready-{i}"), str(sync / "go")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(workers)
    ]
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while len(list(sync.glob("ready-*"))) < workers:
            assert all(p.poll() is None for p in procs), "a worker died before the start"
            assert time.monotonic() < deadline, "workers never got ready"
            time.sleep(0.01)
        (sync / "go").touch()
        outputs = [p.communicate(timeout=SUBPROCESS_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * workers, [err for _, err in outputs]

    results = [json.loads(out) for out, _ in outputs]
    ran = sorted(path.name for path in runs.iterdir())
    assert len(ran) == 1, f"the body ran {len(ran)} times: {ran}"
    values = [r["value"] for r in results]
    assert all(v == values[0] for v in values), values
    assert values[0]["x"] == 42
    assert sum(r["info"] for r in results) == 1  # one computed; the others read it


# -- key stability across interpreter runs ------------------------------------------------------

KEY_MODULE = '''
import dataclasses
import enum

import arrowstash


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


@dataclasses.dataclass
class Point:
    x: int
    y: float
    tags: tuple = ()


@arrowstash.cache(backend=None)
def f(a, b=None):
    return a
'''

KEY_SCRIPT = '''
import datetime as dt
import decimal
import json
import pathlib
import sys
import uuid

import numpy as np
import pandas as pd

import ast_key_mod as mod

utc = dt.timezone.utc
plus2 = dt.timezone(dt.timedelta(hours=2))
cases = {
    "int": (7,), "bigint": (2**100,), "negint": (-3,), "bool": (True,), "none": (None,),
    "float": (1.5,), "float_int": (7.0,), "zero": (0.0,), "negzero": (-0.0,),
    "nan": (float("nan"),), "inf": (float("inf"),),
    "str": ("héllo",), "str_empty": ("",), "bytes": (b"h\\x00llo",),
    "tuple": ((1, "a", (2.5, None)),), "list": ([1, "a", [2.5, None]],),
    "dict_ab": ({"a": 1, "b": [1, 2], 3: "c"},), "dict_ba": ({3: "c", "b": [1, 2], "a": 1},),
    "set_str": ({"alpha", "beta", "gamma", "delta", "epsilon"},),
    "set_str_2": (set(reversed(["alpha", "beta", "gamma", "delta", "epsilon"])),),
    "frozenset": (frozenset({"x", 1, 2.5}),),
    "dt_naive": (dt.datetime(2024, 5, 6, 7, 8, 9, 123456),),
    "dt_utc": (dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=utc),),
    "dt_plus2": (dt.datetime(2024, 5, 6, 9, 8, 9, 123456, tzinfo=plus2),),
    "date": (dt.date(2024, 5, 6),), "timedelta": (dt.timedelta(days=1, seconds=5),),
    "decimal": (decimal.Decimal("3.14159"),), "decimal_2": (decimal.Decimal("3.141590"),),
    "uuid": (uuid.UUID("12345678-1234-5678-1234-567812345678"),),
    "path": (pathlib.PurePosixPath("/tmp/some/file.txt"),),
    "enum_red": (mod.Color.RED,), "enum_blue": (mod.Color.BLUE,),
    "dataclass": (mod.Point(1, 2.5, ("a", "b")),),
    "ndarray": (np.arange(12, dtype="<i8").reshape(3, 4),),
    "ndarray_f": (np.linspace(0, 1, 7),),
    "ndarray_strided": (np.arange(24, dtype="<i8")[::2],),
    "dataframe": (pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", None], "c": [0.5, 1.5, 2.5]}),),
    "series": (pd.Series([1.0, 2.0], index=["p", "q"], name="s"),),
    "nested": ({"k": ({"z", "y"}, [dt.date(2020, 1, 1)], {"inner": b"1"})},),
}
order = list(cases)
if sys.argv[1] == "reverse":
    order.reverse()
out = {}
for label in order:
    out[label] = mod.f.cache_key(*cases[label]).hex
calls = {"pos": mod.f.cache_key(1, 2), "kw": mod.f.cache_key(1, b=2),
         "allkw": mod.f.cache_key(a=1, b=2), "allkw_rev": mod.f.cache_key(b=2, a=1)}
if sys.argv[1] == "reverse":
    calls = dict(reversed(list(calls.items())))
for label, key in calls.items():
    out["call_" + label] = key.hex
print(json.dumps(out))
'''

# Labels whose arguments are equal values built differently: they must share a key.
_SAME_KEY = [
    {"dict_ab", "dict_ba"},
    {"set_str", "set_str_2"},
    {"call_pos", "call_kw", "call_allkw", "call_allkw_rev"},
]


@pytest.mark.slow
def test_keys_are_stable_across_interpreter_runs(tmp_path: Path) -> None:
    (tmp_path / "ast_key_mod.py").write_text(KEY_MODULE)
    runs = []
    for seed, order in (("0", "forward"), ("4242", "reverse")):
        proc = subprocess.run(
            [sys.executable, "-c", KEY_SCRIPT, order],
            env=_env(tmp_path, PYTHONHASHSEED=seed), capture_output=True, text=True,
            timeout=SUBPROCESS_TIMEOUT, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout))
    first, second = runs
    assert first.keys() == second.keys()
    differing = sorted(label for label in first if first[label] != second[label])
    assert differing == [], f"keys differ between runs for {differing}"

    for group in _SAME_KEY:
        assert len({first[label] for label in group}) == 1, group
    # Everything else is a different argument: each gets its own key.
    representatives = {label for label in first if not any(label in g for g in _SAME_KEY)}
    representatives |= {min(g) for g in _SAME_KEY}
    assert len({first[label] for label in representatives}) == len(representatives)


def _same_named_function() -> Any:
    @arrowstash.cache(backend=None)
    def signed(x: float) -> float:
        return math.copysign(1.0, x)

    return signed


def test_key_does_not_depend_on_earlier_calls() -> None:
    """The same call gets the same key whatever this process computed before (0.0 == -0.0 and
    hash(0.0) == hash(-0.0), but the key encoding tells them apart)."""
    fresh, used = _same_named_function(), _same_named_function()
    assert fresh.cache_key(-0.0) == _same_named_function().cache_key(-0.0)
    used.cache_key(0.0)
    assert used.cache_key(-0.0) == fresh.cache_key(-0.0)
    # ...and so a cached call returns what the function returns for those arguments.
    calls = _same_named_function()
    assert calls(0.0) == 1.0
    assert calls(-0.0) == -1.0


# -- a held mapped read outlives the file -------------------------------------------------------


def test_held_mapped_read_survives_overwrite_and_delete(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "cache", mmap_threshold=MMAP_THRESHOLD)
    serializer = StandardSerializer()
    key = Key("ns", "fn", bytes(range(16)))
    old = {"n": 1, "data": [1_000_001] * 5000, "text": "old" * 100}
    new = {"n": 2, "data": [2_000_002] * 6000, "text": "new" * 100}
    assert backend.set(EntryWriter(key, serializer.encode(old), time.time(), None)) > 4096
    held = backend.get(key)
    assert held is not None and held.mapped

    backend.set(EntryWriter(key, serializer.encode(new), time.time(), None))
    current = backend.get(key)
    assert current is not None
    entry = parse_entry(current.data)
    assert serializer.decode(entry.meta, entry.sections) == new
    del current, entry
    assert backend.delete(key)
    assert backend.get(key) is None
    # A writer in another process reusing the name, and eviction of everything, change nothing.
    other = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from arrowstash import FileBackend, StandardSerializer
            from arrowstash.entry.format import EntryWriter, Key
            b = FileBackend({str(tmp_path / "cache")!r}, max_bytes=1)
            value = StandardSerializer().encode([3] * 9000)
            b.set(EntryWriter(Key("ns", "fn", bytes(range(16))), value, time.time(), None))
            b.evict()
        """)],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, check=False,
    )
    assert other.returncode == 0, other.stderr
    gc.collect()

    entry = parse_entry(held.data, check_sections=True)
    assert entry.key == key
    assert serializer.decode(entry.meta, entry.sections) == old
    # Sections are views into the mapping: they keep it alive once the Stored is gone.
    sections = entry.sections
    del held, entry
    gc.collect()
    assert serializer.decode(None, sections) == old


# -- threads of one process ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("use_file", "l1"), [(True, True), (True, False), (False, True)],
    ids=["file+l1", "file-only", "l1-only"],
)
def test_threads_on_a_cold_key_run_the_body_once(tmp_path: Path, use_file: bool,
                                                  l1: bool) -> None:
    threads_count = 8
    runs: list[int] = []
    guard = threading.Lock()

    @arrowstash.cache(backend=FileBackend(tmp_path / "cache") if use_file else None, l1=l1)
    def compute(x: int) -> dict[str, Any]:
        with guard:
            runs.append(threading.get_ident())
        time.sleep(0.2)
        return {"x": x, "token": uuid.uuid4().hex}

    barrier = threading.Barrier(threads_count)
    results: list[Any] = [None] * threads_count
    errors: list[BaseException] = []

    def call(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = compute(7)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(threads_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(runs) == 1, f"the body ran {len(runs)} times"
    assert all(r == results[0] for r in results), results
    assert results[0]["x"] == 7
    info = compute.cache_info()
    assert (info.misses, info.hits) == (1, threads_count - 1)
