"""Per-call cost of a cache HIT: arrowstash's ``@cache`` against its peers.

Run it from the repository root::

    python benchmarks/bench_decorator.py [--quick]

Every contender caches ``record(x: int) -> dict`` (a small dict). Each one is warmed (the first
call computes), then checked to have run its body exactly once, so every timed call is a hit;
arrowstash and cachekit are also checked to serve their hits from the layer under test (their
``cache_info()``). Batches of calls are timed with ``time.perf_counter_ns``, the contenders
interleaved round-robin so machine noise hits all alike, and the median per-call time is
reported as a Markdown table, followed by the targets of the hit-latency issue (PASS/FAIL).
The "metrics on" contenders are the same modes with ``arrowstash.metrics.enable()`` in force
while their batches run (it is switched off for every other contender's batches), so the cost
of metrics is measured side by side with the plain modes.

``--quick`` is a CI smoke run (under 30 s); the default run takes well under 3 minutes. The peers
come from ``pip install --group bench``; one that is not installed is skipped with a note.
Timings include the ~20 ns of the timing loop itself. cachekit moves its metrics to a background
thread when a check 5 s in finds over 100 calls/s; a ``--quick`` run ends before that, so
cachekit's numbers differ between the two modes.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import itertools
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import arrowstash
from _charts import chart, plot_option
from _order import shuffled_rounds

Record = dict[str, Any]
Func = Callable[[int], Record]
Decorate = Callable[[Func, Path, ExitStack], Func]
ARG = 7

AS_L1 = "arrowstash L1 (backend=None)"
AS_L1_FILE = "arrowstash L1 over File"
AS_FILE = "arrowstash File (l1=False)"
AS_L1_METRICS = "arrowstash L1, metrics on"
AS_FILE_METRICS = "arrowstash File (l1=False), metrics on"
CK_L1 = "cachekit L1-only (backend=None)"
CK_L1_FILE = "cachekit L1 over File"
CK_FILE = "cachekit File (l1_enabled=False)"
DISKCACHE = "diskcache memoize"


def expected(x: int) -> Record:
    return {"id": x, "name": "abc", "score": 1.5, "tags": ["a", "b"]}


def _arrowstash(file: bool, l1: bool) -> Decorate:
    def decorate(body: Func, tmp: Path, stack: ExitStack) -> Func:
        backend = arrowstash.FileBackend(tmp) if file else None
        return arrowstash.cache(backend=backend, l1=l1)(body)

    return decorate


def _cachekit(file: bool, l1: bool) -> Decorate:
    def decorate(body: Func, tmp: Path, stack: ExitStack) -> Func:
        from cachekit import cache
        from cachekit.backends.file import FileBackend, FileBackendConfig

        if not file:  # cachekit's L1-only mode; l1_enabled=False would leave no cache at all
            return cache(backend=None)(body)
        backend = FileBackend(FileBackendConfig(cache_dir=tmp))
        return cache(backend=backend, l1_enabled=l1)(body)

    return decorate


def _lru_cache(body: Func, tmp: Path, stack: ExitStack) -> Func:
    return functools.lru_cache(maxsize=1024)(body)


def _cachetools(body: Func, tmp: Path, stack: ExitStack) -> Func:
    import cachetools

    return cachetools.cached(cachetools.LRUCache(maxsize=1024))(body)


def _joblib(body: Func, tmp: Path, stack: ExitStack) -> Func:
    from joblib import Memory

    return Memory(tmp, verbose=0).cache(body)


def _diskcache(body: Func, tmp: Path, stack: ExitStack) -> Func:
    from diskcache import Cache

    return stack.enter_context(Cache(str(tmp))).memoize()(body)


class Spec(NamedTuple):
    name: str
    package: str  # the distribution that provides it; "" for the standard library
    baseline: str | None  # the arrowstash mode it is compared with
    from_l1: bool | None  # where its hits must come from, checked with cache_info()
    decorate: Decorate
    metrics: bool = False  # arrowstash.metrics enabled while it runs


SPECS = [
    Spec(AS_L1, "arrowstash", None, True, _arrowstash(file=False, l1=True)),
    Spec(AS_L1_FILE, "arrowstash", None, True, _arrowstash(file=True, l1=True)),
    Spec(AS_FILE, "arrowstash", None, False, _arrowstash(file=True, l1=False)),
    Spec(AS_L1_METRICS, "prometheus_client", AS_L1, True, _arrowstash(file=False, l1=True),
         metrics=True),
    Spec(AS_FILE_METRICS, "prometheus_client", AS_FILE, False, _arrowstash(file=True, l1=False),
         metrics=True),
    Spec("functools.lru_cache", "", AS_L1, None, _lru_cache),
    Spec("cachetools.cached(LRUCache)", "cachetools", AS_L1, None, _cachetools),
    Spec(CK_L1, "cachekit", AS_L1, True, _cachekit(file=False, l1=True)),
    Spec(CK_L1_FILE, "cachekit", AS_L1_FILE, True, _cachekit(file=True, l1=True)),
    Spec(CK_FILE, "cachekit", AS_FILE, False, _cachekit(file=True, l1=False)),
    Spec("joblib.Memory.cache", "joblib", AS_FILE, None, _joblib),
    Spec(DISKCACHE, "diskcache", AS_FILE, None, _diskcache),
]
PIP_NAMES = {"cachekit": "cachekit==0.24.1", "prometheus_client": "'arrowstash[prometheus]'"}
TARGETS = [  # (label, slower contender, arrowstash mode, minimum ratio)
    ("(1) arrowstash L1 hit vs cachekit L1-only hit", CK_L1, AS_L1, 10.0),
    ("(2a) arrowstash File hit (L1 off) vs cachekit File hit (L1 off)", CK_FILE, AS_FILE, 4.0),
    ("(2b) arrowstash File hit (L1 off) vs diskcache memoize", DISKCACHE, AS_FILE, 2.0),
]
#: (label, plain mode, metered mode, maximum cost of metrics as a fraction of the plain time)
OVERHEADS = [("(3) metrics on: L1 hit overhead", AS_L1, AS_L1_METRICS, 0.20),
             ("(info) metrics on: File hit (L1 off) overhead", AS_FILE, AS_FILE_METRICS, None)]


def metrics_for(c: Contender) -> None:
    """Switch arrowstash.metrics to what the contender about to run wants."""
    if c.spec.metrics != arrowstash.metrics.enabled():
        if c.spec.metrics:
            from prometheus_client import CollectorRegistry

            arrowstash.metrics.enable(CollectorRegistry())
        else:
            arrowstash.metrics.disable()


@dataclass
class Contender:
    spec: Spec
    fn: Func
    runs: list[int]  # how many times the body ran
    batch: int = 0
    times: list[float] = field(default_factory=list)  # wall ns per call, one per batch
    cpu: list[float] = field(default_factory=list)  # this thread's CPU ns per call, likewise


def counted_body(slug: int) -> tuple[Func, list[int]]:
    """A fresh function with its own name, so no two contenders share a cache key."""
    runs = [0]

    def body(x: int) -> Record:
        runs[0] += 1
        return expected(x)

    body.__name__ = body.__qualname__ = f"record_{slug}"
    return body, runs


def check(c: Contender) -> None:
    """Fail unless every call but the first was a hit, from the layer the mode is about."""
    if c.runs[0] != 1:
        raise SystemExit(f"{c.spec.name}: body ran {c.runs[0]} times, not once: calls missed")
    if c.spec.from_l1 is not None:
        info = c.fn.cache_info()  # type: ignore[attr-defined]
        if info.l1_hits != (info.hits if c.spec.from_l1 else 0):
            raise SystemExit(f"{c.spec.name}: hits not served by the expected layer: {info}")


def time_calls(fn: Func, n: int) -> tuple[int, int]:
    """Nanoseconds that n calls of fn(ARG) take: wall, and this thread's CPU time (which the
    other processes of a loaded machine disturb less)."""
    cpu = time.thread_time_ns()
    start = time.perf_counter_ns()
    for _ in itertools.repeat(None, n):
        fn(ARG)
    return time.perf_counter_ns() - start, time.thread_time_ns() - cpu


def warm(c: Contender, batch_ns: float) -> None:
    """First call computes; then size a batch to last about batch_ns and check the hits."""
    metrics_for(c)
    if c.fn(ARG) != expected(ARG):
        raise SystemExit(f"{c.spec.name}: wrong result")
    n = 16
    while (elapsed := time_calls(c.fn, n)[0]) < batch_ns / 4:
        n *= 2
    check(c)
    c.batch = max(20, round(n * batch_ns / elapsed))


def measure(contenders: list[Contender], rounds: int) -> None:
    """One batch per contender per round, in an order shuffled each round."""
    for order in shuffled_rounds(contenders, rounds):
        for c in order:
            metrics_for(c)
            wall, cpu = time_calls(c.fn, c.batch)
            c.times.append(wall / c.batch)
            c.cpu.append(cpu / c.batch)


def version(package: str) -> str:
    return f"{package} {importlib.metadata.version(package)}"


def report(contenders: list[Contender], rounds: int) -> None:
    median = {c.spec.name: statistics.median(c.times) / 1000 for c in contenders}
    packages = dict.fromkeys(c.spec.package for c in contenders if c.spec.package)
    print(f"\nPython {platform.python_version()}, " + ", ".join(map(version, packages)))
    print(f"median of {rounds} interleaved batches per contender; ratio = peer / arrowstash\n")
    print("| contender | median µs/call | p10-p90 µs | CPU µs/call | calls/batch "
          "| ratio vs arrowstash |")
    print("|---|---:|---:|---:|---:|---|")
    for c in contenders:
        deciles = statistics.quantiles(c.times, n=10)
        base = c.spec.baseline
        ratio = "—" if base is None else f"{median[c.spec.name] / median[base]:.2f}x {base}"
        print(f"| {c.spec.name} | {median[c.spec.name]:.2f} "
              f"| {deciles[0] / 1000:.2f}-{deciles[-1] / 1000:.2f} "
              f"| {statistics.median(c.cpu) / 1000:.2f} | {c.batch} | {ratio} |")
    print("\nTargets:")
    for label, peer, mode, need in TARGETS:
        if peer not in median:
            print(f"- SKIP {label}: {peer} not measured")
            continue
        ratio = median[peer] / median[mode]
        verdict = "PASS" if ratio >= need else "FAIL"
        print(f"- {verdict} {label}: {ratio:.1f}x faster (target >= {need:g}x)")
    for label, plain, metered, limit in OVERHEADS:
        if metered not in median:
            print(f"- SKIP {label}: {metered} not measured")
            continue
        cost = median[metered] / median[plain] - 1
        verdict = "INFO" if limit is None else "PASS" if cost <= limit else "FAIL"
        target = "" if limit is None else f" (target <= +{limit:.0%})"
        print(f"- {verdict} {label}: {cost:+.1%}, {median[metered]:.2f} vs "
              f"{median[plain]:.2f} µs{target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats: a CI smoke run")
    plot_option(parser)
    args = parser.parse_args()
    quick = args.quick
    rounds, batch_ns = (9, 10e6) if quick else (101, 30e6)
    with ExitStack() as stack:  # closes the peers' stores, then removes their folders
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-decorator-")))
        contenders = []
        for i, spec in enumerate(SPECS):
            if spec.package and importlib.util.find_spec(spec.package) is None:
                pip_name = PIP_NAMES.get(spec.package, spec.package)
                print(f"skipped {spec.name}: {spec.package} is not installed "
                      f"(pip install --group bench, or pip install {pip_name})")
                continue
            body, runs = counted_body(i)
            fn = spec.decorate(body, root / f"c{i}", stack)
            contenders.append(Contender(spec, fn, runs))
        for c in contenders:
            warm(c, batch_ns)
        measure(contenders, rounds)
        for c in contenders:
            check(c)
    report(contenders, rounds)
    chart(args.plot, "decorator", "a hit of a function of one int (medians)",
          [c.spec.name for c in contenders],
          {"wall": [statistics.median(c.times) / 1e9 for c in contenders],
           "CPU": [statistics.median(c.cpu) / 1e9 for c in contenders]})


if __name__ == "__main__":
    main()
