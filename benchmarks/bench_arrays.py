"""Storing and loading large NumPy values: arrowstash's "arrays" and "buffers" against its peers.

Run it from the repository root::

    python benchmarks/bench_arrays.py [--quick] [--repeats N] [--tmp DIR]

``--quick`` (100 MiB values, 2 rounds) takes under a minute; the default run (1 GiB values,
3 rounds) about five, on two cores.

Two values: one float64 array (1 GiB; ``--quick``: 100 MiB) and a dict of 20 float64 arrays
(20 x 50 MiB; ``--quick``: 20 x 5 MiB) plus a little metadata. The data are random (read from a
seed file written once), so that no contender gains by compressing them.

Every store and every load runs in a fresh interpreter (this script, ``--child``): it imports
its contender and warms it up on a tiny value, builds the value (stores only), returns freed
memory to the OS, resets its peak-RSS mark (``/proc/self/clear_refs``, Linux) and then times
the one operation. "peak extra" is VmHWM afterwards minus VmRSS at the reset: the memory the
operation itself needed. A load is then "touched" (every array summed, the sum checked against
the stored value's) and that is timed and measured separately: a memory-mapped load returns
before reading any data, so its load time and RSS alone flatter it; load + touch is the fair
figure for code that reads everything. Each operation's CPU time (``time.process_time`` of its
child, all threads) is reported beside its wall time: a shared machine's load moves the wall
time, much less the CPU time.

Contenders, each in its own folder of one temporary directory (same file system):
pickle protocol 4 and protocol 5 in-band (``pickle.dump``/``load`` on a file), protocol 5 with
its buffers out-of-band (written after the stream, 64-byte aligned, loaded through a private
memory map), ``np.save``/``np.load`` (a dict: one .npy per array plus JSON), also with
``mmap_mode="r"``, ``joblib.dump``/``load`` (also ``mmap_mode="r"``), cachekit's ``@cache``
(``serializer="auto"``, its File backend, ``l1_enabled=False``; note: cachekit always fsyncs
its writes, nobody else here does), diskcache's ``memoize`` and arrowstash's ``@cache``
(``FileBackend``, ``l1=False``) with ``serializer="auto"`` (which picks "arrays") and
``"buffers"``. Nothing is fsynced or synced: a store writes into the page cache and each load
finds its file there (warm). A contender's files are deleted once its loads are done, so dirty
pages rarely reach the disk; stores of 1 GiB still vary between runs with the machine's
writeback, hence the min-max column. (An ``os.sync()`` between operations made the stores after
it slower and noisier here, not steadier.)

Before each timed operation the child writes and deletes a scratch file of the data's size
(see ``_probes.prefault``: this VM hands idle memory back to its host, and re-faulting it would
otherwise dominate whichever operation ran after an idle spell). That happens before the
peak-RSS reset and is not counted.

Repeats are interleaved (every contender once per round, in a seeded shuffled order, see
``_order.py``) and medians are reported as Markdown tables, followed by the targets of the
arrays issue (PASS/FAIL).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _probes
from _charts import chart, plot_option
from _order import shuffled_rounds

MIB = 1 << 20
TINY = -1  # the tag of the warm-up value
STORE_TARGET = 1.25  # arrowstash store within 1.25x of np.save
LOAD_TARGET = 1.25  # arrowstash load within 1.25x of np.load(mmap_mode="r")
PICKLE_SPEEDUP = 2.0  # arrowstash load at least 2x faster than pickle 4 and joblib
RSS_TARGET = 0.05  # peak extra RSS at most +5% of the data

# writer -> the readers of what it wrote
WRITERS: dict[str, list[str]] = {
    "pickle-4": ["pickle-4"],
    "pickle-5 in-band": ["pickle-5 in-band"],
    "pickle-5 out-of-band": ["pickle-5 out-of-band (mmap)"],
    "np.save": ["np.load", 'np.load(mmap_mode="r")'],
    "joblib": ["joblib.load", 'joblib.load(mmap_mode="r")'],
    "cachekit auto": ["cachekit auto"],
    "diskcache memoize": ["diskcache memoize"],
    "arrowstash auto": ["arrowstash auto"],
    "arrowstash buffers": ["arrowstash buffers"],
}
AS_AUTO, AS_BUFFERS = "arrowstash auto", "arrowstash buffers"
NP_MMAP = 'np.load(mmap_mode="r")'


# -- the child: one operation of one contender --------------------------------------------------


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) * 1024
    return values


def _settle_and_reset(scratch: Path, prefault: int) -> int:
    """Return freed memory to the OS, reset the peak mark; the RSS it starts from."""
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    _probes.prefault(scratch, prefault)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status()["VmRSS"]


def _build(case: str, seed: str, nbytes: int) -> Any:
    """The value, read from the seed file into fresh, resident arrays."""
    import numpy as np

    if case == "array":
        return np.fromfile(seed, dtype=np.float64, count=nbytes // 8)
    each = nbytes // 20 // 8
    value: dict[str, Any] = {
        f"a{i:02d}": np.fromfile(seed, dtype=np.float64, count=each, offset=i * each * 8)
        for i in range(20)
    }
    value["meta"] = {"name": "run-42", "arrays": 20, "rows": each, "tags": ["x", "y"],
                     "created": "2024-05-01T12:00:00", "score": 0.875}
    return value


def _tiny(case: str) -> Any:
    import numpy as np

    array = np.arange(1 << 16, dtype=np.float64)  # 512 KiB
    return array if case == "array" else {"a00": array, "meta": {"name": "warm-up"}}


def _arrays(value: Any) -> list[Any]:
    return [value] if not isinstance(value, dict) else [v for k, v in value.items() if k != "meta"]


def _fingerprint(value: Any) -> list[Any]:
    """What a load is checked against: every array's sum (checked loosely: the summation order
    may depend on alignment) and a few elements (checked exactly)."""
    out = []
    for array in _arrays(value):
        n = len(array)
        out.append([float(array.sum()), float(array[0]), float(array[n // 2]), float(array[-1]),
                    n])
    return out


class _Files:
    """Contenders that write files of their own: one path per tag."""

    suffix = ".bin"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, tag: int) -> Path:
        return self.directory / f"{tag}{self.suffix}"


class _Pickle(_Files):
    suffix = ".pkl"

    def __init__(self, directory: Path, protocol: int) -> None:
        super().__init__(directory)
        self.protocol = protocol

    def store(self, value: Any, tag: int) -> None:
        import pickle

        with open(self.path(tag), "wb") as f:
            pickle.dump(value, f, protocol=self.protocol)

    def load(self, tag: int, reader: str) -> Any:
        import pickle

        with open(self.path(tag), "rb") as f:
            return pickle.load(f)


class _PickleOutOfBand(_Files):
    """Protocol 5: the stream, then every buffer 64-byte aligned; loaded through a private map."""

    suffix = ".p5"
    _align = 64

    def store(self, value: Any, tag: int) -> None:
        import pickle

        buffers: list[pickle.PickleBuffer] = []
        stream = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        head = struct.pack(f"<QQ{len(raws)}Q", len(stream), len(raws), *(r.nbytes for r in raws))
        with open(self.path(tag), "wb") as f:
            for part in (head, stream, *raws):
                f.write(b"\0" * (-f.tell() % self._align))
                f.write(part)

    def load(self, tag: int, reader: str) -> Any:
        import mmap
        import pickle

        with open(self.path(tag), "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        view = memoryview(mapped)
        length, count = struct.unpack_from("<QQ", view)
        sizes = struct.unpack_from(f"<{count}Q", view, 16)
        parts, offset = [], 16 + 8 * count
        for size in (length, *sizes):
            offset += -offset % self._align
            parts.append(view[offset : offset + size])
            offset += size
        return pickle.loads(parts[0], buffers=parts[1:])


class _NpSave(_Files):
    suffix = ".npy"

    def store(self, value: Any, tag: int) -> None:
        import numpy as np

        if not isinstance(value, dict):
            np.save(self.path(tag), value)
            return
        folder = self.directory / str(tag)
        folder.mkdir()
        order = [k for k in value if k != "meta"]
        for k in order:
            np.save(folder / f"{k}.npy", value[k])
        (folder / "meta.json").write_text(json.dumps({"order": order, "meta": value["meta"]}))

    def load(self, tag: int, reader: str) -> Any:
        import numpy as np

        mode = "r" if "mmap" in reader else None
        if self.path(tag).exists():
            return np.load(self.path(tag), mmap_mode=mode)
        folder = self.directory / str(tag)
        info = json.loads((folder / "meta.json").read_text())
        value = {k: np.load(folder / f"{k}.npy", mmap_mode=mode) for k in info["order"]}
        value["meta"] = info["meta"]
        return value


class _Joblib(_Files):
    suffix = ".joblib"

    def store(self, value: Any, tag: int) -> None:
        import joblib

        joblib.dump(value, self.path(tag))

    def load(self, tag: int, reader: str) -> Any:
        import joblib

        return joblib.load(self.path(tag), mmap_mode="r" if "mmap" in reader else None)


class _Decorated:
    """Contenders that are caching decorators: a store is a miss, a load a hit."""

    def __init__(self, decorate: Callable[[Any], Any]) -> None:
        self.value: Any = None
        self.computed: list[int] = []

        def result(tag: int) -> Any:
            self.computed.append(tag)
            return self.value

        self.cached = decorate(result)

    def store(self, value: Any, tag: int) -> None:
        self.value, self.computed[:] = value, []
        self.cached(tag)
        self.value = None
        assert self.computed == [tag], "the store was not a miss"

    def load(self, tag: int, reader: str) -> Any:
        self.computed[:] = []
        value = self.cached(tag)
        if self.computed:
            raise RuntimeError(f"{reader}: the load was a miss")
        return value


#: cachekit's LZ4 + xxHash envelope ("ByteStorage", on by default) refuses inputs over 512 MiB
#: ("input exceeds maximum size"); its NumPy path skips it, a dict of arrays does not.
CACHEKIT_ENVELOPE_LIMIT = 512 * MIB


def _cachekit_integrity(case: str, nbytes: int) -> bool:
    return case == "array" or nbytes <= CACHEKIT_ENVELOPE_LIMIT


def _contender(writer: str, directory: Path, case: str, nbytes: int) -> Any:
    if writer.startswith("pickle-5 out"):
        return _PickleOutOfBand(directory)
    if writer.startswith("pickle-"):
        return _Pickle(directory, int(writer.split()[0][-1]))
    if writer == "np.save":
        return _NpSave(directory)
    if writer == "joblib":
        return _Joblib(directory)
    if writer == "cachekit auto":
        os.environ["CACHEKIT_MAX_VALUE_SIZE"] = str(8 << 30)  # default 100 MB: would not store
        from cachekit import cache
        from cachekit.backends.file import FileBackend, FileBackendConfig

        config = FileBackendConfig(cache_dir=directory, max_size_mb=16384, max_value_mb=4096)
        backend = FileBackend(config)
        integrity = _cachekit_integrity(case, nbytes)
        return _Decorated(cache(backend=backend, l1_enabled=False, serializer="auto",
                                integrity_checking=integrity))
    if writer == "diskcache memoize":
        import diskcache

        cache = diskcache.Cache(str(directory), size_limit=1 << 40)  # default 1 GB: evicts
        return _Decorated(cache.memoize())
    if writer in (AS_AUTO, AS_BUFFERS):
        import arrowstash

        backend = arrowstash.FileBackend(directory)
        serializer = "auto" if writer == AS_AUTO else "buffers"
        return _Decorated(arrowstash.cache(backend=backend, l1=False, serializer=serializer))
    raise ValueError(writer)


def child(role: str, writer: str, reader: str, case: str, directory: str, seed: str,
          nbytes: int) -> dict[str, Any]:
    import numpy as np

    contender = _contender(writer, Path(directory), case, nbytes)
    scratch = Path(directory).parent / f".scratch-{os.getpid()}"
    if role == "store":
        contender.store(_tiny(case), TINY)  # warm up every code path of the store
        contender.load(TINY, writer)
        value = _build(case, seed, nbytes)
        fingerprint = _fingerprint(value)
        base = _settle_and_reset(scratch, nbytes)
        started, cpu = time.perf_counter(), time.process_time()
        contender.store(value, 0)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        peak = _status()["VmHWM"] - base
        return {"seconds": seconds, "cpu": cpu, "peak": peak, "fingerprint": fingerprint}
    warm = contender.load(TINY, reader)
    np.asarray(_arrays(warm)[0]).sum()
    del warm
    base = _settle_and_reset(scratch, nbytes)
    started, cpu = time.perf_counter(), time.process_time()
    value = contender.load(0, reader)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    peak = _status()["VmHWM"] - base
    started = time.perf_counter()
    fingerprint = _fingerprint(value)
    touch = time.perf_counter() - started
    touched = _status()["VmHWM"] - base
    writable = all(getattr(a, "flags", None) is not None and a.flags.writeable
                   for a in _arrays(value))
    return {"seconds": seconds, "cpu": cpu, "peak": peak, "touch": touch, "touched_peak": touched,
            "fingerprint": fingerprint, "writable": writable}


# -- the parent: rounds, checks, tables ---------------------------------------------------------


def _run_child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True,
        timeout=900, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {args[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _same(loaded: list[Any], stored: list[Any]) -> bool:
    for got, want in zip(loaded, stored, strict=True):
        if got[1:] != want[1:] or abs(got[0] - want[0]) > 1e-9 * max(1.0, abs(want[0])):
            return False
    return len(loaded) == len(stored)


def _write_seed(path: Path, nbytes: int) -> None:
    import numpy as np

    rng = np.random.default_rng(20240501)
    chunk = 32 * MIB // 8
    with open(path, "wb") as f:
        left = nbytes // 8
        while left:
            n = min(chunk, left)
            rng.random(n).tofile(f)
            left -= n


Samples = dict[str, dict[str, list[float]]]  # contender -> metric -> samples


def run(quick: bool, repeats: int, tmp: str | None, plot: str | None = None) -> None:
    sizes = {"array": 100 * MIB, "dict": 100 * MIB} if quick else {"array": 1 << 30,
                                                                   "dict": 1000 * MIB}
    root = Path(tempfile.mkdtemp(prefix="bench-arrays-", dir=tmp))
    samples: dict[str, Samples] = {case: {} for case in sizes}
    problems: list[str] = []
    started = time.perf_counter()
    try:
        seed = root / "seed.f64"
        _write_seed(seed, max(sizes.values()))
        writers = list(WRITERS)
        for round_, order in enumerate(shuffled_rounds(writers, repeats)):
            for case, nbytes in sizes.items():
                for writer in order:
                    folder = root / case / writer.replace(" ", "_").replace('"', "")
                    common = [case, str(folder), str(seed), str(nbytes)]
                    try:
                        _measure(samples[case], writer, common, problems)
                    except RuntimeError as exc:  # reported, and the other contenders go on
                        problems.append(f"{case}/{writer}: {str(exc).splitlines()[-1]}")
                    shutil.rmtree(folder, ignore_errors=True)
            print(f"round {round_ + 1}/{repeats} done after {time.perf_counter() - started:.0f} s",
                  file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(samples, sizes, quick, repeats, time.perf_counter() - started, problems)
    charts(plot, samples, sizes)


def _measure(into: Samples, writer: str, common: list[str], problems: list[str]) -> None:
    """Store with ``writer`` in one child, then load with each of its readers in one child."""
    stored = _run_child(["store", writer, writer, *common])
    put = into.setdefault(writer, {})
    put.setdefault("store", []).append(stored["seconds"])
    put.setdefault("store_cpu", []).append(stored["cpu"])
    put.setdefault("store_peak", []).append(stored["peak"])
    for reader in WRITERS[writer]:
        loaded = _run_child(["load", writer, reader, *common])
        got = into.setdefault(reader, {})
        for metric in ("seconds", "cpu", "peak", "touch", "touched_peak"):
            got.setdefault(metric, []).append(loaded[metric])
        got.setdefault("writable", []).append(float(loaded["writable"]))
        if not _same(loaded["fingerprint"], stored["fingerprint"]):
            problems.append(f"{common[0]}/{reader}: loaded data differ")


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:,.3f}" if ms < 1 else f"{ms:,.1f}" if ms < 100 else f"{ms:,.0f}"


def _spread(samples: list[float]) -> str:
    """The median, and the range of the samples."""
    return f"{_ms(_median(samples))} ({_ms(min(samples))}-{_ms(max(samples))})"


def _mb(nbytes: float, size: int) -> str:
    return f"{nbytes / MIB:,.1f} ({nbytes / size:+.1%})"


def _versions() -> str:
    import numpy as np

    names = ["arrowstash", "numpy", "joblib", "cachekit", "diskcache"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (missing)")
    found[1] = f"numpy {np.__version__}"
    return ", ".join(found)


def report(samples: dict[str, Samples], sizes: dict[str, int], quick: bool, repeats: int,
           elapsed: float, problems: list[str]) -> None:
    print(f"# Large NumPy values: store and load ({'--quick' if quick else 'full run'})\n")
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
          f"{_versions()}. Medians of {repeats} interleaved rounds, each operation in a fresh "
          f"process; page cache warm, no fsync (cachekit fsyncs its own writes). "
          f"Run took {elapsed:.0f} s.\n")
    describe = {"array": "one float64 array", "dict": "dict of 20 float64 arrays + metadata"}
    for case, size in sizes.items():
        print(f"## {describe[case]}: {size / MIB:,.0f} MiB\n")
        print("| contender | store ms (min-max) | store CPU ms | store peak extra MiB "
              "| load ms (min-max) | load CPU ms | load peak extra MiB | touch ms "
              "| load + touch ms | peak after touch MiB | writable |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|")
        for writer, readers in WRITERS.items():
            wrote = samples[case].get(writer)
            for i, reader in enumerate(readers):
                got = samples[case].get(reader)
                if wrote is None or got is None:
                    print(f"| {reader} |" + " n/a |" * 10)
                    continue
                store = (_spread(wrote["store"]), _ms(_median(wrote["store_cpu"])),
                         _mb(_median(wrote["store_peak"]), size))
                if i:
                    store = ("same", "same", "same")
                touch = _median(got["touch"])
                both = _median([a + b for a, b in zip(got["seconds"], got["touch"], strict=True)])
                print(f"| {reader} | {' | '.join(store)} | {_spread(got['seconds'])} | "
                      f"{_ms(_median(got['cpu']))} | "
                      f"{_mb(_median(got['peak']), size)} | {_ms(touch)} | {_ms(both)} | "
                      f"{_mb(_median(got['touched_peak']), size)} | "
                      f"{'yes' if min(got['writable']) else 'no'} |")
        if not _cachekit_integrity(case, size):
            print("\ncachekit ran with `integrity_checking=False` here: with its default envelope "
                  "(LZ4 + xxHash3) it refuses values over 512 MiB and returns them uncached.")
        print()
    targets(samples, sizes)
    if problems:
        print("\n**Problems:** " + "; ".join(problems))


def charts(plot: str | None, samples: dict[str, Samples], sizes: dict[str, int]) -> None:
    """One chart per value: each reader's store (its writer's), load, and load + touch."""
    for case, size in sizes.items():
        got = {reader: (samples[case][writer], samples[case][reader])
               for writer, readers in WRITERS.items() for reader in readers
               if writer in samples[case] and reader in samples[case]}
        chart(plot, f"arrays_{case}", f"{case} of {size / MIB:,.0f} MiB: store and load (medians)",
              list(got), {
                  "store": [_median(wrote["store"]) for wrote, _ in got.values()],
                  "load": [_median(read["seconds"]) for _, read in got.values()],
                  "load + touch": [_median([a + b for a, b in zip(read["seconds"], read["touch"],
                                                                  strict=True)])
                                   for _, read in got.values()]})


def targets(samples: dict[str, Samples], sizes: dict[str, int]) -> None:
    rows: list[tuple[str, str, bool | None]] = []

    def med(case: str, who: str, metric: str) -> float:
        return _median(samples[case][who][metric])

    def row(name: str, measure: Callable[[], tuple[str, bool | None]]) -> None:
        try:
            rows.append((name, *measure()))
        except KeyError:
            rows.append((name, "n/a", False))

    for case, size in sizes.items():
        arrowstash = [AS_AUTO] + ([AS_BUFFERS] if case == "dict" else [])
        for who in arrowstash:
            label = f"{case}: {who}"

            def store(case: str = case, who: str = who) -> tuple[str, bool]:
                ratio = med(case, who, "store") / med(case, "np.save", "store")
                best = min(samples[case][who]["store"]) / min(samples[case]["np.save"]["store"])
                return f"{ratio:.2f}x (fastest: {best:.2f}x)", ratio <= STORE_TARGET

            def store_cpu(case: str = case, who: str = who) -> tuple[str, None]:
                ratio = med(case, who, "store_cpu") / med(case, "np.save", "store_cpu")
                return f"{ratio:.2f}x", None

            def load(case: str = case, who: str = who) -> tuple[str, bool]:
                ratio = med(case, who, "seconds") / med(case, NP_MMAP, "seconds")
                return f"{ratio:.2f}x", ratio <= LOAD_TARGET

            row(f"{label} store <= {STORE_TARGET}x np.save", store)
            row(f"{label} store CPU time ÷ np.save's (informative)", store_cpu)
            row(f"{label} load <= {LOAD_TARGET}x {NP_MMAP}", load)
            for peer in ("pickle-4", "joblib.load"):

                def faster(case: str = case, who: str = who, peer: str = peer
                           ) -> tuple[str, bool]:
                    speedup = med(case, peer, "seconds") / med(case, who, "seconds")
                    return f"{speedup:,.0f}x", speedup >= PICKLE_SPEEDUP

                def touched(case: str = case, who: str = who, peer: str = peer
                            ) -> tuple[str, None]:
                    ratio = (med(case, peer, "seconds") + med(case, peer, "touch")) / (
                        med(case, who, "seconds") + med(case, who, "touch"))
                    return f"{ratio:.2f}x", None

                row(f"{label} load >= {PICKLE_SPEEDUP:.0f}x faster than {peer}", faster)
                row(f"{label} load + touch, speed-up over {peer} (informative)", touched)
            for metric, what in (("store_peak", "store"), ("peak", "load")):

                def extra(case: str = case, who: str = who, metric: str = metric,
                          size: int = size) -> tuple[str, bool]:
                    share = med(case, who, metric) / size
                    return f"{share:+.2%}", share <= RSS_TARGET

                row(f"{label} {what} peak extra RSS <= +{RSS_TARGET:.0%}", extra)
    print("## Targets\n")
    print("| target | measured | result |")
    print("|---|---:|:-:|")
    for name, measured, ok in rows:
        print(f"| {name} | {measured} | {'-' if ok is None else 'PASS' if ok else 'FAIL'} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        role, writer, reader, case, directory, seed, nbytes = sys.argv[2:9]
        print(json.dumps(child(role, writer, reader, case, directory, seed, int(nbytes))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 MiB values, < 60 s")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds (default 3; 2 with --quick)")
    parser.add_argument("--tmp", default=None, help="folder for the temporary files")
    plot_option(parser)
    options = parser.parse_args()
    run(options.quick, options.repeats or (2 if options.quick else 3), options.tmp, options.plot)


if __name__ == "__main__":
    main()
