"""The requests ObjectStoreBackend makes, seen by moto's server: a large entry read by
concurrent ranged GETs into one buffer that the value then views (no copy), conditional on the
entry's ETag, with a peak RSS close to the value's size; what a miss, a store and a hit cost
(the table of docs/clusters.md); ``clear`` deleting our objects only, in batches."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from arrowstash import cache
from arrowstash.backends.object_store import ObjectStoreBackend, Tuning
from arrowstash.entry.format import EntryWriter, Key, parse_entry
from arrowstash.serializers.arrays import ArraySerializer
from servers import S3Server

pytestmark = pytest.mark.s3

TESTS = Path(__file__).parents[1]
PART = 5 << 20


def _backend(server: S3Server, prefix: str, concurrency: int = 4) -> ObjectStoreBackend:
    return ObjectStoreBackend(server.url(prefix), **server.credentials,
                              tuning=Tuning(multipart_from=PART, part_bytes=PART,
                                            range_bytes=PART, max_concurrency=concurrency))


_LINE = re.compile(r'"(?:\x1b\[[\d;]*m)*(\w+) (\S+) HTTP/1\.1(?:\x1b\[[\d;]*m)*" (\d+)')


class _Requests(logging.Handler):
    """The requests moto's server (werkzeug) logs once it has answered each one."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def seen(self, prefix: str, expected: int) -> list[tuple[str, str, str]]:
        """(method, target, status) of the requests under ``prefix`` and of batch deletes,
        once ``expected`` of them landed (and a moment later, so that any more are seen)."""
        deadline = time.monotonic() + 5
        while len(self._under(prefix)) < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        return self._under(prefix)

    def _under(self, prefix: str) -> list[tuple[str, str, str]]:
        return [(m[1], m[2], m[3]) for m in map(_LINE.search, list(self.lines))
                if m and (prefix in m[2] or m[2].endswith("?delete"))]


@pytest.fixture
def requests() -> Iterator[_Requests]:
    werkzeug = logging.getLogger("werkzeug")
    seen, level = _Requests(), werkzeug.level
    werkzeug.addHandler(seen)
    werkzeug.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        werkzeug.removeHandler(seen)
        werkzeug.setLevel(level)


def test_a_large_entry_arrives_by_ranged_gets_into_one_buffer_the_value_views(
        s3_server: S3Server, unique_prefix: str, requests: _Requests) -> None:
    backend = _backend(s3_server, unique_prefix, concurrency=2)
    array = np.random.default_rng(2).random(3 << 20)  # 24 MiB

    @cache(backend=backend, l1=False)
    def make() -> np.ndarray:
        return array

    make()
    (entry,) = backend.entries()
    requests.lines.clear()
    got = make()
    made = requests.seen(unique_prefix, 3)
    assert make.cache_info().hits == 1
    np.testing.assert_array_equal(got, array)
    # the first 5 MiB, then the other 19 MiB in two ranges at once: every GET a range
    assert [(method, status) for method, _, status in made] == [("GET", "206")] * 3
    # the value lies inside the one 64-byte aligned buffer the ranges were copied into
    view = got.base
    while not isinstance(view, memoryview):
        view = view.base
    buffer = view.obj
    # (the object's size: uploaded while serialized, the entry has its header at the end too)
    assert isinstance(buffer, pa.Buffer) and buffer.size == entry.size + 64
    assert buffer.address % 64 == 0
    start = got.__array_interface__["data"][0]
    assert buffer.address <= start and start + got.nbytes <= buffer.address + buffer.size


def test_a_small_entry_is_one_get(s3_server: S3Server, unique_prefix: str) -> None:
    backend = _backend(s3_server, unique_prefix)
    key = Key("ns", "f", bytes(16))
    array = np.arange(1000)
    backend.set(EntryWriter(key, ArraySerializer().encode(array), time.time(), None))
    stored = backend.get(key)
    assert stored is not None and not isinstance(stored.data.obj, pa.Buffer)  # obstore's own


@pytest.mark.parametrize("kind", ["s3", "memory", "folder"])
def test_an_empty_object_is_a_miss_not_a_failure(kind: str, s3_server: S3Server,
                                                 unique_prefix: str, tmp_path: Path) -> None:
    import obstore

    backend = {"s3": lambda: ObjectStoreBackend(s3_server.url(unique_prefix),
                                                **s3_server.credentials),
               "memory": lambda: ObjectStoreBackend(f"objstore+memory://{unique_prefix}"),
               "folder": lambda: ObjectStoreBackend(f"objstore+file://{tmp_path}")}[kind]()
    key = Key("ns", "f", bytes(16))
    obstore.put(backend._store, backend._path(key), b"")
    stored = backend.get(key)  # no range to read: handed on, for the parser to refuse
    assert stored is not None and stored.data.nbytes == 0
    assert backend.breaker.state == "closed"


def test_a_read_never_mixes_two_versions_of_an_entry(s3_server: S3Server, unique_prefix: str,
                                                     requests: _Requests) -> None:
    """The ranges after the first are conditional on its ETag: an entry replaced between the
    first range and the others fails them, and the read is a miss. The reader's one range
    thread is kept busy until the first range was answered, and replaces the entry then."""
    backend = _backend(s3_server, unique_prefix, concurrency=1)
    key = Key("ns", "f", bytes(16))
    path = backend._path(key)

    def put(fill: int) -> None:
        value = np.full(2 << 20, fill, dtype=np.float64)  # 16 MiB
        backend.set(EntryWriter(key, ArraySerializer().encode(value), time.time(), None))

    def replace_after_the_first_range() -> None:
        requests.lines.clear()
        requests.seen(path, 1)
        put(2)

    put(1)
    backend._pool().submit(replace_after_the_first_range)
    assert backend.get(key) is None
    assert [status for method, target, status in requests._under(path)
            if method == "GET"] == ["206", "412"]
    stored = backend.get(key)  # unconditional first range, so the new version in full
    assert stored is not None
    entry = parse_entry(stored.data)
    assert set(ArraySerializer().decode(entry.meta, entry.sections)) == {2.0}


#: What both fresh-process probes below start with: the peak-RSS mark, reset and read (Linux).
_PEAK = r"""
import ctypes, gc

def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))

def reset_peak():
    # freed memory back to the OS, the high-water mark reset to VmRSS, which is returned
    gc.collect(); ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status("VmRSS")
"""


_HIT = _PEAK + r"""
import json, sys
import numpy as np
from arrowstash.backends.object_store import ObjectStoreBackend, Tuning
from arrowstash.entry.format import Key, parse_entry
from arrowstash.serializers.arrays import ArraySerializer

tuning = Tuning(range_bytes=8 << 20, max_concurrency=2)
backend = ObjectStoreBackend(sys.argv[1], tuning=tuning)
serializer = ArraySerializer()

def hit(name):
    stored = backend.get(Key("ns", name, bytes(16)))
    entry = parse_entry(stored.data)
    return serializer.decode(entry.meta, entry.sections)

hit("small")  # warm: threads, connections, imports
base = reset_peak()
value = hit("large")
print(json.dumps({"rise": status("VmHWM") - base, "size": value.nbytes,
                  "sum": float(value[::4096].sum())}))
"""


def test_a_hit_holds_the_value_about_once(s3_server: S3Server, unique_prefix: str) -> None:
    """Peak RSS of the hit of a 128 MiB array, in a fresh process: the buffer, plus its first
    8 MiB range and the chunks in flight; a second copy of the value would make it 2x."""
    backend = _backend(s3_server, unique_prefix)
    large = np.random.default_rng(3).random(16 << 20)
    for name, value in (("small", large[: 2 << 20]), ("large", large)):
        backend.set(EntryWriter(Key("ns", name, bytes(16)), ArraySerializer().encode(value),
                                time.time(), None))
    env = {**os.environ, **s3_server.environment,
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])}
    done = subprocess.run([sys.executable, "-c", _HIT, s3_server.url(unique_prefix)], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["sum"] == pytest.approx(float(large[::4096].sum()))
    assert figures["size"] == large.nbytes
    assert figures["rise"] / large.nbytes < 1.2, figures


_STORE = _PEAK + r"""
import json, sys, time
import numpy as np
from arrowstash.backends.object_store import ObjectStoreBackend, Tuning
from arrowstash.entry.format import EntryWriter, Key
from arrowstash.serializers.arrays import ArraySerializer

part = 5 << 20
tuning = Tuning(multipart_from=part, part_bytes=part, max_concurrency=2)
backend = ObjectStoreBackend(sys.argv[1], tuning=tuning)

def store(name, value):
    encoded = ArraySerializer().encode(value)
    return backend.set(EntryWriter(Key("ns", name, bytes(16)), encoded, time.time(), None))

value = np.random.default_rng(6).random(16 << 20)
store("small", value[: 2 << 20])  # warm: threads, connections, imports
base = reset_peak()
size = store("large", value)
print(json.dumps({"rise": status("VmHWM") - base, "value": value.nbytes, "entry": size}))
"""


def test_a_store_holds_a_few_parts_not_the_entry(s3_server: S3Server, unique_prefix: str
                                                  ) -> None:
    """Peak RSS of storing a 128 MiB array, in a fresh process, beyond the array itself: the
    first 5 MiB collected before the upload starts, and the parts in flight (two uploading,
    one filling). Spooled or collected whole, the entry would add 1x."""
    env = {**os.environ, **s3_server.environment,
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])}
    done = subprocess.run([sys.executable, "-c", _STORE, s3_server.url(unique_prefix)],
                          env=env, capture_output=True, text=True, timeout=300, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["entry"] > figures["value"] == 128 << 20
    assert figures["rise"] / figures["value"] < 0.35, figures
    backend = ObjectStoreBackend(s3_server.url(unique_prefix), **s3_server.credentials)
    assert [e.size for e in backend.entries() if e.function == "large"] == [figures["entry"]]


@pytest.mark.parametrize("kind", ["memory", "folder"])
def test_the_local_stores_read_by_ranges_too(kind: str, unique_prefix: str,
                                             tmp_path: Path) -> None:
    url = f"objstore+memory://{unique_prefix}" if kind == "memory" else \
        f"objstore+file://{tmp_path}"
    backend = ObjectStoreBackend(url, tuning=Tuning(range_bytes=PART))
    key = Key("ns", "f", bytes(16))
    array = np.random.default_rng(4).random(3 << 19)  # 12 MiB: three ranges
    backend.set(EntryWriter(key, ArraySerializer().encode(array), time.time(), None))
    stored = backend.get(key)
    assert stored is not None and isinstance(stored.data.obj, pa.Buffer)
    entry = parse_entry(stored.data)
    np.testing.assert_array_equal(ArraySerializer().decode(entry.meta, entry.sections), array)


def test_what_a_miss_a_store_and_a_hit_cost(s3_backend: ObjectStoreBackend, unique_prefix: str,
                                            requests: _Requests) -> None:
    """The rows of docs/clusters.md's table of requests, for an entry under 16 MiB."""

    @cache(backend=s3_backend, l1=False)
    def locked(n: int) -> list[int]:
        return list(range(n))

    @cache(backend=s3_backend, l1=False, lock=False)
    def unlocked(n: int) -> list[int]:
        return list(range(n))

    def cost(call: Any) -> list[tuple[str, str, str]]:
        requests.lines.clear()
        call()
        return [(method, "lock" if ".lock" in target else "entry" if ".ast" in target else
                 "batch", status) for method, target, status in requests.seen(unique_prefix, 1)]

    assert cost(lambda: locked(10)) == [
        ("GET", "entry", "404"), ("PUT", "lock", "200"), ("PUT", "entry", "200"),
        ("GET", "lock", "200"), ("POST", "batch", "200")]
    assert cost(lambda: locked(10)) == [("GET", "entry", "206")]  # one ranged GET
    assert cost(lambda: unlocked(10)) == [("GET", "entry", "404"), ("PUT", "entry", "200")]
    key = Key("ns", "f", bytes(16))

    def poll_once() -> None:
        with s3_backend.lock(key, timeout=0.0) as waited:  # one attempt, then it gives up
            assert not waited

    with s3_backend.lock(key, timeout=1.0) as held:
        assert held
        assert cost(poll_once) == [("PUT", "lock", "412"), ("GET", "lock", "200")]


def test_clear_deletes_our_objects_only_in_batches(s3_backend: ObjectStoreBackend,
                                                   unique_prefix: str,
                                                   requests: _Requests) -> None:
    import obstore

    store = s3_backend._store
    ours = [s3_backend._path(Key("ns", "f", i.to_bytes(16, "big"))) for i in range(1001)]
    ours.append(s3_backend._path(Key("ns", "g", bytes(16)), ".lock"))
    foreign = ["ns/readme.txt", "ns/f/data.parquet", "ns2/f/" + ours[0].rsplit("/", 1)[1],
               "other/f/x.ast"]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda path: obstore.put(store, path, b"x"), ours + foreign))
    requests.lines.clear()
    assert s3_backend.clear("ns") == 1001  # entries; the lock went too
    made = requests.seen(unique_prefix, 4)
    lists = [target for method, target, _ in made if method == "GET"]
    deletes = [target for method, target, _ in made if method == "POST"]
    assert len(lists) == 2 and all("list-type=2" in target for target in lists)
    assert len(deletes) == 2  # 1,000 and 2
    left = sorted(meta["path"] for chunk in obstore.list(store) for meta in chunk)
    assert left == sorted(foreign)


@pytest.mark.slow
def test_a_200_mb_frame_goes_up_in_parts_and_comes_back_in_ranges(
        s3_backend: ObjectStoreBackend, unique_prefix: str, requests: _Requests) -> None:
    import pandas as pd

    rng = np.random.default_rng(5)
    frame = pd.DataFrame({"x": rng.random(12_500_000), "y": rng.integers(0, 1 << 40, 12_500_000)})
    assert frame.memory_usage().sum() >= 200_000_000

    @cache(backend=s3_backend, l1=False)
    def make() -> pd.DataFrame:
        return frame

    make()
    stored = requests.seen(unique_prefix, 1)
    requests.lines.clear()
    pd.testing.assert_frame_equal(make(), frame)
    read = requests.seen(unique_prefix, 5)
    (entry,) = s3_backend.entries()
    parts = [target for method, target, _ in stored if method == "PUT" and "partNumber" in target]
    # 8 MiB parts of the object: the entry, and its header again at the end (see _Upload)
    assert len(parts) == -(-(entry.size + 64) // s3_backend.tuning.part_bytes)
    assert sum("uploadId" in target and method == "POST" for method, target, _ in stored) == 1
    assert [(method, status) for method, _, status in read] == [("GET", "206")] * 5
