"""``arrowstash bench``: how fast a backend stores and serves the values arrowstash caches.

The scripts under ``benchmarks/`` compare arrowstash with its peers; this command answers the
question a user has about their own deployment ("how long does a hit take on *our* Redis?"),
with nothing installed beyond arrowstash. Entries go to the namespace ``arrowstash-bench``,
which is cleared before and after; the folders it leaves are removed.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from arrowstash.backends.base import Backend
from arrowstash.caching.decorator import CachedFunction, cache
from arrowstash.cli._output import emit_json, human_size, human_time, needs, progress, say, table

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


def run(url: str | None, values: list[str], rows: int, mib: int, repeats: int,
        as_json: bool = False, plot: str | None = None) -> int:
    """Print one row per value (and draw them into ``plot``); 1 if a hit did not give back the
    value. Values whose library is missing are skipped with the extra to install."""
    from arrowstash.backends.registry import default_backend, file_folder, from_url

    if plot:
        from arrowstash.cli._plot import check

        check()  # a missing extra fails before the work, not after

    folder = file_folder(url)
    created = folder is not None and not folder.exists()
    backend = from_url(url) if url else default_backend()
    makers: dict[str, Callable[[], Any]] = {
        "small": _small, "frame": lambda: _frame(rows), "array": lambda: _array(mib),
    }
    results, skipped = [], []
    backend.clear(NAMESPACE)
    try:
        for name in progress(values, "benchmarking"):
            try:
                value = makers[name]()
            except ModuleNotFoundError as exc:
                skipped.append(f"{name}: {needs(exc)}")
                continue
            results.append(measure(backend, name, value, repeats))
    finally:
        backend.clear(NAMESPACE)
        if folder is not None:
            _remove_empty_folders(folder, created)
    if as_json:
        emit_json({"backend": repr(backend), "repeats": repeats, "hits": 3 * repeats,
                   "results": results, "skipped": skipped})
    else:
        _print(backend, results, skipped, repeats)
    if plot and results:
        from arrowstash.cli._plot import bars

        bars(plot, [r["value"] for r in results],
             {f"store (miss through @cache), median of {repeats}": [r["store"] for r in results],
              f"hit (L1 off), median of {3 * repeats}": [r["hit"] for r in results]},
             f"arrowstash bench: {type(backend).__name__}")
        if not as_json:
            say(f"chart: {plot}")
    return 0 if all(row["same"] for row in results) else 1


def _print(backend: Backend, results: list[dict[str, Any]], skipped: list[str],
           repeats: int) -> None:
    say(f"backend {backend!r}")
    say(f"store: a miss through @cache (encode + write), median of {repeats}; "
        f"hit: read + decode with L1 off, median of {3 * repeats}")
    table(("value", "serializer", "stored", "store", "hit", "hit == value"),
          [(r["value"], r["serializer"], "?" if r["bytes"] is None else human_size(r["bytes"]),
            human_time(r["store"]), human_time(r["hit"]), r["same"]) for r in results],
          right=("stored", "store", "hit"))
    for line in skipped:
        say(f"skipped {line}")


def _remove_empty_folders(root: Path, remove_root: bool) -> None:
    """Remove the folders the benchmark's namespace left (empty after clearing), and the cache
    folder itself if the benchmark created it and it is empty."""
    for top in root.glob(f"{NAMESPACE}*"):
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):  # not empty: someone else's entry
                folder.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
    if remove_root:
        from arrowstash.backends._file_io import TEMP_FOLDER
        from arrowstash.backends._file_space import LOCKS_FOLDER

        for own in (LOCKS_FOLDER, TEMP_FOLDER):  # the File backend's working folders
            with contextlib.suppress(OSError):
                (root / own).rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()
