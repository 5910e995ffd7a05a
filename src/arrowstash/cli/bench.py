"""``arrowstash bench``: how fast a backend stores and serves the values arrowstash caches.

The scripts under ``benchmarks/`` compare arrowstash with its peers; this command answers the
question a user has about their own deployment ("how long does a hit take on *our* Redis?"),
with nothing installed beyond arrowstash. Entries go to the namespace ``arrowstash-bench``,
which is cleared before and after.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, cast

from arrowstash.backends.base import Backend
from arrowstash.caching.decorator import CachedFunction, cache
from arrowstash.cli._output import human_size

NAMESPACE = "arrowstash-bench"
VALUES = ("small", "frame", "array")


def _small() -> dict[str, Any]:
    return {"user": 4711, "name": "Ada", "scores": [1.5, 2.25, 3.0], "active": True}


def _frame(rows: int) -> Any:
    """Columns of the kinds a frame cache holds: ints, floats, timestamps, repeated strings."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "id": np.arange(rows, dtype=np.int64),
        "value": rng.random(rows),
        "delay": rng.integers(-30, 300, rows).astype(np.int32),
        "at": pd.date_range("2026-01-01", periods=rows, freq="s", tz="UTC"),
        "carrier": pd.Series(rng.choice(["AA", "B6", "DL", "UA", "WN"], rows), dtype="str"),
    })


def _array(mib: int) -> Any:
    import numpy as np

    return np.random.default_rng(0).random(mib * (1 << 20) // 8)


def _same(a: Any, b: Any) -> bool:
    equals = getattr(a, "equals", None)
    if callable(equals):
        return bool(equals(b))
    if hasattr(a, "shape"):
        import numpy as np

        return bool(np.array_equal(a, b))
    return bool(a == b)


def measure(backend: Backend, name: str, value: Any, repeats: int) -> dict[str, Any]:
    """Median store and hit times of ``value`` through ``@cache`` with L1 off."""

    def body(name: str, round_: int) -> Any:
        return value

    # cache() is typed to return the function's own type; the object is a CachedFunction
    produce = cast(CachedFunction, cache(backend=backend, namespace=NAMESPACE, l1=False,
                                         strict=True)(body))

    stores: list[float] = []
    hits: list[float] = []
    same = True
    for round_ in range(repeats):
        started = time.perf_counter()
        produce(name, round_)
        stores.append(time.perf_counter() - started)
        for _ in range(3):
            started = time.perf_counter()
            got = produce(name, round_)
            hits.append(time.perf_counter() - started)
        same = same and _same(got, value)
    info = produce.cache_info()
    if info.misses != repeats or info.hits != 3 * repeats:
        raise RuntimeError(f"{name}: the value was not cached ({info})")
    key = produce.cache_key(name, 0)
    stored = [e for e in backend.entries(NAMESPACE) if e.key == key.hex]  # none on Memcached
    return {
        "value": name,
        "serializer": stored[0].serializer if stored else "?",
        "bytes": stored[0].size if stored else None,
        "store": statistics.median(stores),
        "hit": statistics.median(hits),
        "same": same,
    }


def run(backend: Backend, values: list[str], rows: int, mib: int, repeats: int,
        out: Callable[[str], None] = print) -> int:
    """Print one row per value; 1 if a hit did not give back the value."""
    makers: dict[str, Callable[[], Any]] = {
        "small": _small, "frame": lambda: _frame(rows), "array": lambda: _array(mib),
    }
    out(f"backend {backend!r}; medians of {repeats} stores and {3 * repeats} hits, L1 off\n")
    out(f"{'value':<8} {'serializer':<10} {'stored':>10} {'store':>11} {'hit':>11}  hit == value")
    backend.clear(NAMESPACE)
    try:
        ok = True
        for name in values:
            row = measure(backend, name, makers[name](), repeats)
            size = "?" if row["bytes"] is None else human_size(row["bytes"])
            out(f"{name:<8} {row['serializer']:<10} {size:>10} {_time(row['store']):>11} "
                f"{_time(row['hit']):>11}  {row['same']}")
            ok = ok and row["same"]
    finally:
        backend.clear(NAMESPACE)
    return 0 if ok else 1


def _time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"
