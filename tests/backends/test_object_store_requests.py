"""How ObjectStoreBackend reads a large entry, against moto's server: concurrent ranged GETs
into one buffer that the value then views (no copy), conditional on the entry's ETag, and a
peak RSS of a hit close to the value's size."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

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


class _Requests(logging.Handler):
    """The request lines moto's server (werkzeug) logs once it has answered each one."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def gets(self, path: str, expected: int) -> list[str]:
        """The statuses of the GETs of ``path``, waiting until ``expected`` of them landed
        (the lines may carry colour codes)."""
        deadline = time.monotonic() + 5
        while True:
            found = [line.rsplit(" ", 2)[-2] for line in self.lines
                     if f"GET /{S3Server.BUCKET}/{path} " in line]
            if len(found) >= expected or time.monotonic() > deadline:
                return found
            time.sleep(0.01)


def test_a_large_entry_arrives_by_ranged_gets_into_one_buffer_the_value_views(
        s3_server: S3Server, unique_prefix: str) -> None:
    backend = _backend(s3_server, unique_prefix)
    array = np.random.default_rng(2).random(3 << 20)  # 24 MiB: five ranges of 5 MiB

    @cache(backend=backend, l1=False)
    def make() -> np.ndarray:
        return array

    make()
    (entry,) = backend.entries()
    (listed,) = backend._objects(None, None)
    path = f"{unique_prefix}/{listed['path']}"
    werkzeug = logging.getLogger("werkzeug")
    requests, level = _Requests(), werkzeug.level
    werkzeug.addHandler(requests)
    werkzeug.setLevel(logging.INFO)
    try:
        got = make()
        parts = -(-entry.size // PART)
        statuses = requests.gets(path, parts)
    finally:
        werkzeug.removeHandler(requests)
        werkzeug.setLevel(level)
    assert make.cache_info().hits == 1
    np.testing.assert_array_equal(got, array)
    assert parts == 5 and statuses == ["206"] * parts  # every GET a range, none whole
    # the value lies inside the one 64-byte aligned buffer the parts were copied into
    view = got.base
    while not isinstance(view, memoryview):
        view = view.base
    buffer = view.obj
    assert isinstance(buffer, pa.Buffer) and buffer.size == entry.size
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


def test_a_read_never_mixes_two_versions_of_an_entry(s3_server: S3Server,
                                                     unique_prefix: str) -> None:
    """The ranges after the first are conditional on its ETag: an entry replaced meanwhile
    fails them, and the read is a miss."""
    import obstore

    backend = _backend(s3_server, unique_prefix)
    key = Key("ns", "f", bytes(16))
    path = backend._path(key)

    def put(fill: int) -> None:
        value = np.full(2 << 20, fill, dtype=np.float64)  # 16 MiB
        backend.set(EntryWriter(key, ArraySerializer().encode(value), time.time(), None))

    put(1)
    first = obstore.get(backend._store, path, options={"range": (0, PART)})
    put(2)
    with pytest.raises(obstore.exceptions.PreconditionError):
        backend._read(path, known=first.meta)
    stored = backend.get(key)  # unconditional first range, so the new version in full
    assert stored is not None and stored.data.nbytes > PART


_HIT = r"""
import ctypes, gc, json, sys
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
gc.collect(); ctypes.CDLL(None).malloc_trim(0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field + ":"))
base = status("VmRSS")
value = hit("large")
print(json.dumps({"rise": status("VmHWM") - base, "size": value.nbytes,
                  "sum": float(value[::4096].sum())}))
"""


def test_a_hit_holds_the_value_about_once(s3_server: S3Server, unique_prefix: str) -> None:
    """Peak RSS of the hit of a 128 MiB array, in a fresh process: the buffer, plus the parts
    in flight (2 of 8 MiB); a second copy of the value would make it 2x."""
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
