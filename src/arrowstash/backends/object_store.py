"""Object stores through obstore: S3 and S3-compatible servers, Google Cloud Storage, Azure Blob
Storage, an in-memory store and a local folder (see docs/clusters.md).

One object per entry, ``<prefix>/<namespace>/<function>/<digest>.ast``, in the entry format.
Object puts are atomic (a multipart upload becomes visible only when completed), so a reader sees
an old entry or a new one, never a part; concurrent writers of one key each store a complete entry
and the last one wins. An entry is collected in memory up to ``Tuning.multipart_from`` and put
in one request; a larger one goes up by multipart upload while it is serialized, so it is never
held in memory whole (see :class:`_Upload`: its header then follows it as the object's last 64
bytes), and a failure aborts the upload. Entries over ``Tuning.range_bytes`` are read by
concurrent ranged GETs into one preallocated, 64-byte aligned buffer, conditional on the ETag
of the first range, so that the serializers view it without a copy and a read never mixes two
versions of an entry.
The stampede lock is an object created with a conditional put (``If-None-Match: *``) that holds
an owner token and a lease; a waiter takes over a lock whose lease has run out with a
conditional put on its ETag (``If-Match``), so two waiters never both take it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import xxhash

from arrowstash.backends._breaker import Breaker
from arrowstash.backends._object_stores import (
    CLOUD_SCHEMES,
    OUR_OPTIONS,
    make_store,
    obstore_module,
    public_url,
    split_url,
)
from arrowstash.backends.base import Capabilities, Held, Stored
from arrowstash.entry.format import ALIGN, EntryWriter, Key
from arrowstash.entry.listing import EntryInfo, describe, trailer_offset
from arrowstash.errors import BackendError, CorruptEntryError

SUFFIX = ".ast"
_LOCK_SUFFIX = ".lock"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_URLS = re.compile(r"(https?://[^\s?\"'<>]*)\?[^\s\"'<>]*")
#: How the stores word the refusal of a range (HTTP 416, and the local stores' errors).
_NO_RANGE = re.compile(r"range not satisfiable|invalid ?range|range was invalid", re.I)
#: Bytes a range of a read hands over at a time (each chunk is copied into the entry's buffer).
_CHUNK = 1 << 20
#: Objects deleted per request by ``clear`` (S3's DeleteObjects takes up to 1000).
_DELETE_BATCH = 1000
#: The first bytes of an object whose entry header is its last 64 bytes (an entry uploaded while
#: it was serialized, see _Upload). Not the entry format's magic: a reader that does not know
#: this layout finds no entry there (a logged miss), never a wrong one.
_FOOTED = b"\x89ASTfoot"


def _part(name: str) -> str:
    """A path segment for a namespace or function: readable where the name is plain, with a
    hash of the name where characters had to be replaced (so names never collide)."""
    safe = _SAFE.sub("_", name)[:64] or "_"
    if safe == name and not name.startswith("."):
        return name
    return f"{safe}~{xxhash.xxh3_64_hexdigest(name.encode())[:12]}"


def _scrub(text: str) -> str:
    """A client error's text without URL query strings (presigned URLs and SAS tokens travel
    there) and cut short."""
    return _URLS.sub(r"\1?…", text)[:400]


@dataclass(frozen=True)
class Tuning:
    """How an ObjectStoreBackend talks to its store: the defaults suit the clouds."""

    #: Seconds a request may take, and a connection attempt; retries of failed requests (each
    #: within ``timeout``), before the call runs uncached and the failure is logged.
    timeout: float = 30.0
    connect_timeout: float = 2.0
    retries: int = 2
    #: An entry is collected in memory up to ``multipart_from`` bytes and put in one request;
    #: a larger one goes by multipart upload while it is serialized, in parts of
    #: ``part_bytes``, ``max_concurrency`` at a time: at most ``multipart_from`` plus
    #: ``part_bytes * (max_concurrency + 1)`` bytes of an upload are in memory at once.
    #: An entry up to ``range_bytes`` is read by one GET;
    #: a larger one by a GET of its first ``range_bytes`` and ``max_concurrency`` ranged GETs
    #: at once for the rest (the clouds serve each connection at a limited rate).
    multipart_from: int = 16 << 20
    part_bytes: int = 8 << 20
    range_bytes: int = 16 << 20
    max_concurrency: int = 4
    #: The circuit breaker: after this many failures in a row, skip the store for a while.
    breaker_failures: int = 5
    breaker_cooldown: float = 5.0

    def __post_init__(self) -> None:
        if self.part_bytes < 5 << 20 or self.multipart_from < 5 << 20:
            raise ValueError(f"part_bytes and multipart_from must be at least 5 MiB (S3's "
                             f"smallest part), not {self.part_bytes!r}, {self.multipart_from!r}")
        if self.range_bytes < 1 << 20:
            raise ValueError(f"range_bytes must be at least 1 MiB, not {self.range_bytes!r}")
        if self.timeout <= 0 or self.connect_timeout <= 0 or self.retries < 0:
            raise ValueError("timeouts must be positive and retries >= 0")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, not {self.max_concurrency!r}")


class ObjectStoreBackend:
    """``ObjectStoreBackend("s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=...")``,
    ``"gs://bucket/prefix"``, ``"az://container/prefix"``, ``"objstore+memory://name"`` (one
    store per name in this process) or ``"objstore+file:///folder"``.

    ``endpoint`` and ``region`` (or the URL's query options of the same names) and any other
    keyword (``access_key_id``, ``secret_access_key``, ``account_name``...) configure the store;
    credentials not given come from the cloud's standard environment. They are never shown:
    reprs, logs and errors carry the URL without its secrets. ``tuning`` sets timeouts,
    retries, multipart uploads and the circuit breaker (:class:`Tuning`).
    """

    def __init__(
        self,
        url: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        tuning: Tuning | None = None,
        encrypt: bool = False,
        **store_options: Any,
    ) -> None:
        tuning = tuning or Tuning()
        scheme, bucket, prefix, query = split_url(url)
        config = {name: value for name, value in query.items() if name not in OUR_OPTIONS}
        if endpoint is not None:
            config["endpoint"] = endpoint
        if region is not None:
            config["region"] = region
        config.update(store_options)
        self._obstore = obstore_module()
        errors = self._obstore.exceptions
        self._answers = (FileNotFoundError, errors.AlreadyExistsError, errors.PreconditionError)
        self.url = public_url(url)
        try:
            self._store = make_store(scheme, bucket, prefix, config, tuning.timeout,
                                     tuning.connect_timeout, tuning.retries)
        except (errors.BaseError, OSError) as exc:
            raise BackendError(f"cannot open the object store {self.url}: "
                               f"{type(exc).__name__}: {_scrub(str(exc))}") from None
        self.scheme = scheme
        self.encrypt = encrypt
        self.tuning = tuning
        self.breaker = Breaker(tuning.breaker_failures, tuning.breaker_cooldown)
        self._readers: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool)
        self._readers_guard = threading.Lock()
        # rebuilt from these in another process (a Dask worker): see __reduce__
        self._made_with = (url, {"endpoint": endpoint, "region": region, "tuning": tuning,
                                 "encrypt": encrypt, **store_options})
        #: Clouds and servers are shared and remote; the memory and local stores are neither.
        cloud = scheme in CLOUD_SCHEMES
        self.capabilities = Capabilities(shared=cloud, remote=cloud, streams_writes=True,
                                         maps_reads=False, lists_entries=True, native_ttl=False,
                                         breaker=True)

    def __repr__(self) -> str:
        return f"ObjectStoreBackend({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the URL and options it was made with, so that a cached function sent to
        another process (a Dask worker) opens the same store there."""
        url, options = self._made_with
        return (_rebuild, (url, options))

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[None]:
        """The boundary: a client error becomes a BackendError (its text without secrets) and
        feeds the circuit breaker."""
        where = f"object store {what} ({self.url})"
        self.breaker.before(where)
        try:
            yield
        except (self._obstore.exceptions.BaseError, OSError) as exc:
            if isinstance(exc, self._answers):  # the store answered: absent, or a condition
                self.breaker.success()
                raise
            self.breaker.failure()
            raise BackendError(f"{where} failed: {type(exc).__name__}: {_scrub(str(exc))}") \
                from None
        self.breaker.success()

    def _path(self, key: Key, suffix: str = SUFFIX) -> str:
        return f"{_part(key.namespace)}/{_part(key.function)}/{key.hex}{suffix}"

    # -- entries ----------------------------------------------------------------------------

    def get(self, key: Key) -> Stored | None:
        """A GET of the first ``range_bytes``; the rest of a larger entry by ranged GETs."""
        try:
            with self._call("get"):
                return Stored(self._read(self._path(key)))
        except FileNotFoundError:
            return None
        except self._obstore.exceptions.PreconditionError:
            return None  # replaced while we read it: a miss, rather than a mix of two entries

    def _read(self, path: str) -> memoryview:
        """The whole object in one buffer: its first ``range_bytes``, then the rest in
        ``max_concurrency`` ranges fetched at once, each streamed into its place (so only a
        chunk per range is in flight besides the buffer; every request has a price, hence few
        large ranges). A small object is obstore's buffer as it is, unless its header must be
        moved (an object written while serialized, see _Upload)."""
        import pyarrow as pa

        first_end = self.tuning.range_bytes
        try:
            first = self._obstore.get(self._store, path, options={"range": (0, first_end)})
        except FileNotFoundError:
            raise
        except self._obstore.exceptions.BaseError as exc:
            # an empty object has no range; a failure of another kind costs no HEAD
            if not _NO_RANGE.search(str(exc)) or self._obstore.head(self._store, path)["size"]:
                raise
            return memoryview(b"")  # not an entry: the reader logs a miss
        meta, head = first.meta, memoryview(first.bytes()).cast("B")
        size = meta["size"]
        if size <= first_end and head[: len(_FOOTED)] != _FOOTED:
            return head
        buffer = memoryview(pa.allocate_buffer(size)).cast("B")
        buffer[: head.nbytes] = head
        del head, first
        same = {"if_match": meta["e_tag"]} if meta["e_tag"] else {}
        step = max(-(-(size - first_end) // self.tuning.max_concurrency), first_end)

        def fetch(start: int) -> None:
            end = min(start + step, size)
            got = self._obstore.get(self._store, path, options={"range": (start, end), **same})
            at = start
            for chunk in got.stream(min_chunk_size=_CHUNK):
                buffer[at : at + len(chunk)] = chunk
                at += len(chunk)
            if at != end:
                raise OSError(f"a range of {path} ended at {at}, not {end}")

        list(self._pool().map(fetch, range(first_end, size, step)))  # raises a range's failure
        return _unfoot(buffer)

    def _pool(self) -> ThreadPoolExecutor:
        """The threads of ranged reads, made in the process that uses them (a pool inherited
        through fork has no threads)."""
        with self._readers_guard:
            if self._readers is None or self._readers[0] != os.getpid():
                pool = ThreadPoolExecutor(self.tuning.max_concurrency,
                                          thread_name_prefix="arrowstash-get")
                self._readers = (os.getpid(), pool)
            return self._readers[1]

    def set(self, entry: EntryWriter) -> int:
        """One PUT of an entry up to ``multipart_from``; a multipart upload of a larger one
        while it is serialized. Whatever fails on the way (the serializer, a request) aborts
        the upload, so that no parts are left behind."""
        with self._call("put"), contextlib.ExitStack() as uploading:
            upload = _Upload(self, self._path(entry.key), uploading)
            size = entry.write(upload)
            upload.finish()
        return size

    def delete(self, key: Key) -> bool:
        path = self._path(key)
        try:
            with self._call("head"):
                self._obstore.head(self._store, path)
        except FileNotFoundError:
            return False
        with self._call("delete"):
            self._obstore.delete(self._store, path)
        return True

    def _objects(self, namespace: str | None, function: str | None) -> Iterator[dict[str, Any]]:
        if namespace is None:
            if function is not None:
                raise ValueError("clear(function=...) needs the namespace too")
            prefix = None
        else:
            prefix = _part(namespace) + ("" if function is None else f"/{_part(function)}")
        with self._call("list"):
            for chunk in self._obstore.list(self._store, prefix=prefix, chunk_size=1000):
                yield from chunk

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        """List the prefix and delete our objects (entries and locks) in batches of 1000."""
        removed = 0
        batch: list[str] = []
        for meta in self._objects(namespace, function):
            path = meta["path"]
            if path.endswith((SUFFIX, _LOCK_SUFFIX)):
                batch.append(path)
                removed += path.endswith(SUFFIX)
            if len(batch) >= _DELETE_BATCH:
                self._delete_many(batch)
                batch = []
        self._delete_many(batch)
        return removed

    def _delete_many(self, paths: list[str]) -> None:
        if paths:
            with self._call("delete"):
                self._obstore.delete(self._store, paths)

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]:
        """Every readable entry, from two ranged reads (header, trailer; three where the header
        follows the entry, see _Upload); others are skipped."""
        metas = [m for m in self._objects(namespace, None) if m["path"].endswith(SUFFIX)]
        for meta in metas:
            path, size = meta["path"], meta["size"]
            try:
                with self._call("read header"):
                    head = self._obstore.get_range(self._store, path, start=0,
                                                   length=min(ALIGN, size))
                    if bytes(head[: len(_FOOTED)]) == _FOOTED and size >= 2 * ALIGN:
                        size -= ALIGN  # the header is the object's last 64 bytes
                        head = self._obstore.get_range(self._store, path, start=size,
                                                       length=ALIGN)
                    start = trailer_offset(head, size)
                    tail = self._obstore.get_range(self._store, path, start=start, end=size)
                yield describe(head, tail, size, f"{self.url}/{path}")
            except (BackendError, CorruptEntryError, FileNotFoundError):
                continue

    def stats(self) -> dict[str, Any]:
        objects = [m for m in self._objects(None, None) if m["path"].endswith(SUFFIX)]
        return {"backend": "object_store", "url": self.url, "entries": len(objects),
                "bytes": sum(m["size"] for m in objects), "breaker": self.breaker.state}

    # -- the stampede lock ------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, key: Key, timeout: float) -> Iterator[Held]:
        """A lock object created only if absent; its lease (``max(timeout, 1)`` seconds from
        its creation) lets others take it over if its owner died."""
        path, token = self._path(key, _LOCK_SUFFIX), secrets.token_hex(16)
        lease = max(timeout, 1.0)
        held = _wait_for(lambda: self._take(path, token, lease), timeout)
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(BackendError):
                    self._give_back(path, token)

    def _take(self, path: str, token: str, lease: float) -> bool:
        body = json.dumps({"owner": token, "until": time.time() + lease}).encode()
        errors = self._obstore.exceptions
        try:
            with self._call("lock"):
                self._obstore.put(self._store, path, body, mode="create")
            return True
        except errors.AlreadyExistsError:
            pass
        try:
            with self._call("lock"):
                found = self._obstore.get(self._store, path)
                meta, held_by = found.meta, bytes(found.bytes())
        except FileNotFoundError:
            return False  # released meanwhile: the next attempt creates it
        if time.time() < _lease_end(held_by):
            return False
        try:  # the lease ran out: take it over, unless another waiter did first
            with self._call("lock"):
                version = {name: meta[name] for name in ("e_tag", "version") if meta[name]}
                self._obstore.put(self._store, path, body, mode=version)
            return True
        except (errors.PreconditionError, errors.AlreadyExistsError, FileNotFoundError):
            return False
        except errors.NotSupportedError:  # a store without conditional updates: it stays
            return False

    def _give_back(self, path: str, token: str) -> None:
        """Delete the lock if it is still ours (not taken over after our lease ran out)."""
        try:
            with self._call("unlock"):
                found = bytes(self._obstore.get(self._store, path).bytes())
                if _owner(found) == token:
                    self._obstore.delete(self._store, path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Stop the threads of ranged reads; obstore's connection pools end with the backend."""
        with self._readers_guard:
            if self._readers is not None and self._readers[0] == os.getpid():
                self._readers[1].shutdown(wait=False)
            self._readers = None


class _Upload:
    """The sink an entry is written into. Its bytes collect in memory, and an entry that ends
    within ``multipart_from`` is put in one request, its header patched in place. Past that, a
    multipart upload starts (obstore's writer: parts go up ``max_concurrency`` at a time while
    the serializer writes on). The parts already sent cannot be patched, so the object starts
    with the mark ``_FOOTED`` where the header belongs and ends with the header: a read moves
    it back (:func:`_unfoot`). Other backends and smaller objects keep the plain format."""

    def __init__(self, backend: ObjectStoreBackend, path: str,
                 uploading: contextlib.ExitStack) -> None:
        self._backend, self._path, self._uploading = backend, path, uploading
        self._buffer = bytearray()
        self._writer: Any = None
        self._header = b""

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        tuning = self._backend.tuning
        if self._writer is None:
            if len(self._buffer) + view.nbytes <= tuning.multipart_from:
                self._buffer += view
                return
            self._start()
        # copied (the serializer may reuse its buffers once write returns) into parts that
        # are ours, handed over as they are (the writer keeps them until they are uploaded)
        step = tuning.part_bytes
        for at in range(0, view.nbytes, step):
            self._buffer += view[at : at + step]
            if len(self._buffer) >= step:
                self._hand_over()

    def _start(self) -> None:
        backend, tuning = self._backend, self._backend.tuning
        # entered on set()'s ExitStack: an exception leaving it aborts the upload
        self._writer = self._uploading.enter_context(backend._obstore.open_writer(
            backend._store, self._path, buffer_size=tuning.part_bytes,
            max_concurrency=tuning.max_concurrency))
        self._buffer[: len(_FOOTED)] = _FOOTED  # over the header's placeholder
        self._hand_over()

    def _hand_over(self) -> None:
        self._writer.write(self._buffer)
        self._buffer = bytearray()

    def patch(self, offset: int, data: bytes) -> None:
        if offset != 0 or len(data) != ALIGN:
            raise ValueError("only an entry's header is patched")
        if self._writer is None:
            self._buffer[:ALIGN] = data
        else:
            self._header = data

    def finish(self) -> None:
        """Put the collected entry, or end the upload with the header (completed when set()
        leaves the ExitStack)."""
        if self._writer is None:
            backend = self._backend
            backend._obstore.put(backend._store, self._path, memoryview(self._buffer),
                                 use_multipart=False)
        else:
            self._buffer += self._header
            self._hand_over()


def _unfoot(view: memoryview) -> memoryview:
    """The entry in an object read whole: as it is, or, for an object that starts with the
    mark ``_FOOTED``, its last 64 bytes (the header) moved to the front, in place."""
    if view.nbytes < 2 * ALIGN or view[: len(_FOOTED)] != _FOOTED:
        return view
    view[:ALIGN] = view[-ALIGN:]
    return view[:-ALIGN]


def _lease_end(body: bytes) -> float:
    """When a lock object's lease ends; 0 (ended) for a body that is not a lock of ours."""
    try:
        until = json.loads(body)["until"]
    except (ValueError, KeyError, TypeError):
        return 0.0
    return float(until) if isinstance(until, (int, float)) else 0.0


def _owner(body: bytes) -> str | None:
    try:
        owner = json.loads(body)["owner"]
    except (ValueError, KeyError, TypeError):
        return None
    return owner if isinstance(owner, str) else None


def _wait_for(attempt: Any, timeout: float) -> Held:
    """Call ``attempt`` until it takes the lock or ``timeout`` passes: pauses grow from 10 ms to
    a quarter second, since every attempt is a billed request."""
    if attempt():
        return Held.FREE
    deadline = time.monotonic() + timeout
    pause = 0.01
    while time.monotonic() < deadline:
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        if attempt():
            return Held.WAITED
        pause = min(pause * 2, 0.25)
    return Held.TIMEOUT


#: Backends rebuilt in this process from pickles, by URL and options: one client per store.
_rebuilt: dict[str, ObjectStoreBackend] = {}


def _rebuild(url: str, options: dict[str, Any]) -> ObjectStoreBackend:
    """The backend a pickle names, made once per process."""
    key = json.dumps([url, sorted(options.items())], default=repr)
    made = _rebuilt.get(key)
    if made is None:
        made = _rebuilt[key] = ObjectStoreBackend(url, **options)
    return made
