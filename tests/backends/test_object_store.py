"""ObjectStoreBackend against a real S3-compatible server (moto's, on a loopback port): every
serializer's values through ``@cache``, multipart uploads, many processes on one cold key, the
server going away and coming back, an upload killed midway, and secrets kept out of text."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from arrowstash import BackendError, Key, StandardSerializer, cache
from arrowstash.backends import from_url
from arrowstash.backends.object_store import ObjectStoreBackend, Tuning
from arrowstash.entry.format import Encoded, EntryWriter, parse_entry
from servers import S3Server

pytestmark = pytest.mark.s3

TESTS = Path(__file__).parents[1]
SRC = TESTS.parent / "src"


def _env(server: S3Server) -> dict[str, str]:
    return {**os.environ, **server.environment,
            "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, "x", None], "b": (1, 2)},
    np.arange(100_000, dtype=np.float32).reshape(100, 1000),
    pd.DataFrame({"x": np.arange(5000), "s": [f"r{i}" for i in range(5000)]}),
    pa.table({"x": np.arange(5000), "s": [f"r{i}" for i in range(5000)]}),
    b"raw bytes" * 1000,
], ids=["standard", "array", "pandas", "arrow", "bytes"])
def test_every_kind_of_value_round_trips(s3_backend: ObjectStoreBackend, value: Any) -> None:
    calls = []

    @cache(backend=s3_backend, l1=False)
    def make(n: int) -> Any:
        calls.append(n)
        return value

    first, again = make(1), make(1)
    assert calls == [1] and make.cache_info().hits == 1
    for got in (first, again):
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(got, value)
        elif isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(got, value)
        elif isinstance(value, pa.Table):
            assert got.equals(value)
        else:
            assert got == value


@dataclass
class _Model:
    """No serializer but pickle's takes this: on a shared store, only under a secret."""

    weights: np.ndarray


def test_polars_frames_and_pickled_objects_round_trip(s3_backend: ObjectStoreBackend) -> None:
    import polars as pl

    frame = pl.DataFrame({"x": np.arange(5000), "s": [f"r{i}" for i in range(5000)]})
    calls = []

    @cache(backend=s3_backend, l1=False, secret="team-secret")
    def make(kind: str) -> Any:
        calls.append(kind)
        return frame if kind == "polars" else _Model(np.arange(100_000.0))

    for _ in range(2):
        assert make("polars").equals(frame)
        np.testing.assert_array_equal(make("model").weights, np.arange(100_000.0))
    assert calls == ["polars", "model"] and make.cache_info().hits == 2


def test_a_large_entry_goes_by_multipart_upload(s3_server: S3Server, unique_prefix: str
                                                ) -> None:
    backend = ObjectStoreBackend(s3_server.url(unique_prefix), **s3_server.credentials,
                                 tuning=Tuning(multipart_from=5 << 20, part_bytes=5 << 20))
    array = np.random.default_rng(1).random(3 << 20)  # 24 MiB: five parts

    @cache(backend=backend, l1=False)
    def make() -> np.ndarray:
        return array

    make()
    np.testing.assert_array_equal(make(), array)
    (entry,) = backend.entries()
    assert entry.size > array.nbytes
    path = backend._path(Key(entry.namespace, entry.function, bytes.fromhex(entry.key)))
    import obstore

    # uploaded while serialized: the header follows the entry, its place holds a mark
    stored = obstore.get(backend._store, path)
    assert stored.meta["size"] == entry.size + 64
    assert bytes(stored.bytes())[:8] == b"\x89ASTfoot"


@pytest.mark.parametrize("size", [0, 100, 4096, 6 << 20])
def test_a_forged_object_with_the_footer_mark_is_a_miss(s3_server: S3Server,
                                                        unique_prefix: str, size: int) -> None:
    import obstore

    backend = ObjectStoreBackend(s3_server.url(unique_prefix), **s3_server.credentials,
                                 tuning=Tuning(range_bytes=1 << 20))
    calls = []

    @cache(backend=backend, l1=False)
    def make() -> np.ndarray:
        calls.append(1)
        return np.arange(10)

    make()
    (entry,) = backend.entries()
    path = backend._path(Key(entry.namespace, entry.function, bytes.fromhex(entry.key)))
    obstore.put(backend._store, path, b"\x89ASTfoot" + os.urandom(size))
    assert list(backend.entries()) == []
    np.testing.assert_array_equal(make(), np.arange(10))
    assert calls == [1, 1] and backend.breaker.state == "closed"


def test_a_failed_store_aborts_its_multipart_upload(s3_server: S3Server, unique_prefix: str
                                                    ) -> None:
    """A serializer that fails once parts went up: no object, and no upload left pending."""
    import boto3

    backend = ObjectStoreBackend(s3_server.url(unique_prefix), **s3_server.credentials,
                                 tuning=Tuning(multipart_from=5 << 20, part_bytes=5 << 20))
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name=s3_server.REGION,
                      aws_access_key_id=s3_server.KEY_ID,
                      aws_secret_access_key=s3_server.SECRET)
    seen: list[int] = []

    def failing(out: Any) -> None:
        for _ in range(4):  # 16 MiB: three parts sent, at least
            out.write(bytes(4 << 20))
        seen.append(len(s3.list_multipart_uploads(Bucket=s3_server.BUCKET,
                                                  Prefix=unique_prefix).get("Uploads", [])))
        raise RuntimeError("the serializer failed")

    key = Key("ns", "f", bytes(16))
    with pytest.raises(RuntimeError, match="the serializer failed"):
        backend.set(EntryWriter(key, Encoded("raw", None, [failing]), time.time(), None))
    assert seen == [1]  # the upload had started
    assert backend.get(key) is None
    assert not s3.list_multipart_uploads(Bucket=s3_server.BUCKET,
                                         Prefix=unique_prefix).get("Uploads")


def test_urls_and_reprs_carry_no_secrets(s3_server: S3Server) -> None:
    url = (s3_server.url("p") + f"&access_key_id={s3_server.KEY_ID}"
           f"&secret_access_key={s3_server.SECRET}")
    backend = from_url(url)
    assert isinstance(backend, ObjectStoreBackend)
    for text in (repr(backend), backend.url, json.dumps(backend.stats())):
        assert s3_server.SECRET not in text
    assert "secret_access_key" in backend.url  # the option's name alone
    with pytest.raises(BackendError, match="cannot open the object store") as failed:
        ObjectStoreBackend(s3_server.url("p") + "&secret_access_key=" + s3_server.SECRET)
    assert s3_server.SECRET not in str(failed.value)


def test_gcs_and_azure_urls_open_their_clouds_stores() -> None:
    """gs:// and az:// name obstore's GCS and Azure stores on that bucket or container and
    prefix (made without a request: no cloud is reachable here); a key passed in stays out of
    the backend's text."""
    gcs = from_url("gs://my-bucket/cache/team")
    assert isinstance(gcs, ObjectStoreBackend)
    assert type(gcs._store).__name__ == "GCSStore"
    assert repr(gcs._store) == 'GCSStore(bucket="my-bucket", prefix="cache/team")'
    key = "c2VjcmV0LWtleS1mb3ItdGVzdHM="
    azure = ObjectStoreBackend("az://my-container/cache", account_name="acct", account_key=key)
    assert type(azure._store).__name__ == "AzureStore"
    assert 'container_name="my-container"' in repr(azure._store)
    assert 'prefix="cache"' in repr(azure._store)
    for text in (repr(azure), azure.url):  # (stats() would list the container: a request)
        assert key not in text


def _put_seen(**options: Any) -> tuple[dict[str, str], bytes]:
    """The headers and body of the PUT that stores an entry, as a socket on a loopback port
    receives them (it answers like S3)."""
    seen: dict[str, str] = {}
    body = bytearray()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve() -> None:
            connection, _ = listener.accept()
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(1 << 16)
                head, _, rest = data.partition(b"\r\n\r\n")
                for line in head.decode().split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    seen[name.strip().lower()] = value.strip()
                body.extend(rest)
                while len(body) < int(seen["content-length"]):
                    body.extend(connection.recv(1 << 16))
                connection.sendall(b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: 0\r\n\r\n')

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        port = listener.getsockname()[1]
        backend = ObjectStoreBackend(f"s3://bucket/p?endpoint=http://127.0.0.1:{port}",
                                     region="us-east-1", access_key_id="k",
                                     secret_access_key="s", **options)
        backend.set(EntryWriter(Key("ns", "f", bytes(16)), StandardSerializer().encode(7),
                                time.time(), None))
        thread.join(10)
    return seen, bytes(body)


def test_s3_request_bodies_are_not_hashed_for_the_signature_unless_asked() -> None:
    """UNSIGNED-PAYLOAD by default (what boto3 sends over https; moto and S3 accept it, as
    every other test here shows); ``unsigned_payload=False`` signs the body's SHA-256."""
    seen, body = _put_seen()
    assert seen["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert "x-amz-content-sha256" in seen["authorization"]  # the header itself is signed
    seen, body = _put_seen(unsigned_payload=False)
    assert seen["x-amz-content-sha256"] == hashlib.sha256(body).hexdigest()


def test_a_dead_server_is_an_uncached_call_then_caching_resumes(unique_prefix: str) -> None:
    server = S3Server().start()
    try:
        backend = ObjectStoreBackend(
            server.url(unique_prefix), **server.credentials,
            tuning=Tuning(timeout=2.0, connect_timeout=0.5, retries=0, breaker_cooldown=0.2))
        calls = []

        @cache(backend=backend, l1=False)
        def double(n: int) -> int:
            calls.append(n)
            return 2 * n

        assert double(1) == 2 and double(1) == 2 and calls == [1]
        server.stop()
        assert double(2) == 4 and double(2) == 4  # no exception; computed each time
        assert calls == [1, 2, 2]
        with pytest.raises(BackendError) as failed:
            backend.get(Key("ns", "f", b"\0" * 16))
        time.sleep(0.3)
        with pytest.raises(BackendError) as failed:
            backend.get(Key("ns", "f", b"\0" * 16))
        assert server.SECRET not in str(failed.value)
        server.restart()  # same port, empty bucket
        time.sleep(0.3)  # past the breaker's cooldown
        assert double(3) == 6 and double(3) == 6
        assert calls == [1, 2, 2, 3]
        with pytest.raises(BackendError):
            cache(backend=backend, strict=True)(lambda: 1)  # still up: no error
            server.stop()
            cache(backend=backend, strict=True, l1=False)(lambda: 1)()
    finally:
        server.stop()


_ONE_KEY = r"""
import os, sys, time
from arrowstash import cache
from arrowstash.backends.object_store import ObjectStoreBackend

url, runs = sys.argv[1], sys.argv[2]

@cache(backend=ObjectStoreBackend(url), lock_timeout=30, namespace="cold")
def slow(n):
    with open(runs, "a") as log:
        log.write(f"{os.getpid()}\n")
    time.sleep(1.0)
    return list(range(n))

assert slow(1000) == list(range(1000))
"""


def test_processes_on_one_cold_key_run_the_body_once(s3_server: S3Server, unique_prefix: str,
                                                     tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    url = s3_server.url(unique_prefix)
    children = [subprocess.Popen([sys.executable, "-c", _ONE_KEY, url, str(runs)],
                                 env=_env(s3_server)) for _ in range(6)]
    assert [child.wait(timeout=120) for child in children] == [0] * 6
    assert len(runs.read_text().splitlines()) == 1


_UPLOAD = r"""
import sys, time
import numpy as np
from arrowstash import StandardSerializer
from arrowstash.backends.object_store import ObjectStoreBackend, Tuning
from arrowstash.entry.format import EntryWriter, Key
from arrowstash.serializers.arrays import ArraySerializer

backend = ObjectStoreBackend(sys.argv[1], tuning=Tuning(multipart_from=5 << 20,
                             part_bytes=5 << 20, max_concurrency=1))
array = np.ones(200 << 20, dtype=np.uint8)
print("uploading", flush=True)
backend.set(EntryWriter(Key("ns", "f", bytes(16)), ArraySerializer().encode(array), 1.0, None))
print("done", flush=True)
"""


def test_an_upload_killed_midway_leaves_no_entry(s3_server: S3Server, unique_prefix: str
                                                 ) -> None:
    import boto3

    url = s3_server.url(unique_prefix)
    child = subprocess.Popen([sys.executable, "-c", _UPLOAD, url],
                             env=_env(s3_server), stdout=subprocess.PIPE, text=True)
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name=s3_server.REGION,
                      aws_access_key_id=s3_server.KEY_ID,
                      aws_secret_access_key=s3_server.SECRET)
    try:
        deadline = time.monotonic() + 60
        while not s3.list_multipart_uploads(Bucket=s3_server.BUCKET,
                                            Prefix=unique_prefix).get("Uploads"):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        uploading = s3.list_multipart_uploads(Bucket=s3_server.BUCKET, Prefix=unique_prefix)
        (upload,) = uploading["Uploads"]
        while not s3.list_parts(Bucket=s3_server.BUCKET, Key=upload["Key"],
                                UploadId=upload["UploadId"]).get("Parts"):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert child.stdout is not None and "done" not in child.stdout.read()
    backend = ObjectStoreBackend(url, **s3_server.credentials)
    assert backend.get(Key("ns", "f", bytes(16))) is None  # parts went up, no object
    assert list(backend.entries()) == []
    s3.abort_multipart_upload(Bucket=s3_server.BUCKET, Key=upload["Key"],
                              UploadId=upload["UploadId"])


def test_an_expired_entry_is_stored_with_its_expiry(s3_backend: ObjectStoreBackend) -> None:
    key = Key("ns", "f", bytes(16))
    s3_backend.set(EntryWriter(key, StandardSerializer().encode(1), time.time(),
                               time.time() - 1))
    stored = s3_backend.get(key)
    assert stored is not None and parse_entry(stored.data).header.expired(time.time())


def test_a_lock_whose_owner_died_expires_with_its_lease(s3_backend: ObjectStoreBackend) -> None:
    key = Key("ns", "f", bytes(16))
    path = s3_backend._path(key, ".lock")
    import obstore

    dead = json.dumps({"owner": "gone", "until": time.time() + 0.5}).encode()
    obstore.put(s3_backend._store, path, dead, mode="create")
    with s3_backend.lock(key, timeout=0.2) as held:
        assert not held  # the lease runs on
    started = time.monotonic()
    with s3_backend.lock(key, timeout=5.0) as held:
        assert held and time.monotonic() - started < 2.0
    with s3_backend.lock(key, timeout=0.1) as held:
        assert held  # released by its new owner


def test_bad_urls_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="names no bucket"):
        ObjectStoreBackend("s3:///prefix")
    with pytest.raises(ValueError, match="part_bytes and multipart_from must be at least 5 MiB"):
        Tuning(part_bytes=1024)


def test_the_documented_lifecycle_rule_is_one_s3_accepts(s3_server: S3Server) -> None:
    import re

    import boto3

    text = (TESTS.parent / "docs" / "clusters.md").read_text()
    found = re.search(r"^```json\n(.*?)^```", text, re.S | re.M)
    assert found is not None
    rule = json.loads(found[1])
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name=s3_server.REGION,
                      aws_access_key_id=s3_server.KEY_ID,
                      aws_secret_access_key=s3_server.SECRET)
    s3.put_bucket_lifecycle_configuration(Bucket=s3_server.BUCKET, LifecycleConfiguration=rule)
    try:
        (kept,) = s3.get_bucket_lifecycle_configuration(Bucket=s3_server.BUCKET)["Rules"]
    finally:
        s3.delete_bucket_lifecycle(Bucket=s3_server.BUCKET)
    assert kept["Expiration"] == {"Days": 7} and kept["Status"] == "Enabled"
    assert kept["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
