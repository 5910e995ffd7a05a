"""The stages of a cached call that touch no backend and never wait: keys, L1, decoding and
encoding entries, trust checks, counters and logs. ``operations`` strings them together."""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from arrowstash import config
from arrowstash.backends.base import Backend, Held, Stored
from arrowstash.backends.registry import opened
from arrowstash.caching.code import CodeTracker
from arrowstash.caching.freshness import Freshness
from arrowstash.caching.keys import KeyMaker
from arrowstash.caching.l1 import L1, L1Item, copier, frozen_size
from arrowstash.caching.logs import EventLog
from arrowstash.caching.observers import Observer
from arrowstash.caching.options import DEFAULT, Options
from arrowstash.entry.crypto import keyring_for
from arrowstash.entry.format import (
    FLAG_ENCRYPTED,
    Encoded,
    Entry,
    EntryWriter,
    Key,
    materialize,
    open_encrypted,
    parse_entry,
    verify_sections,
)
from arrowstash.errors import BackendError, CorruptEntryError, SerializationError
from arrowstash.serializers.base import Serializer
from arrowstash.serializers.registry import AutoSerializer, resolve

#: Keys of this many recent digests are kept by each cached function (about 150 bytes each).
_KEYS_KEPT = 1024
MISSING: Any = object()
#: A first look that found the backend failing: the call computes without it (one timeout).
UNREACHABLE: Any = object()
ABSENT = (MISSING, 0.0)
DOWN = (UNREACHABLE, 0.0)


@dataclass(frozen=True)
class CacheInfo:
    """Counters of one cached function in this process (``hits`` includes ``l1_hits``)."""

    hits: int
    misses: int
    l1_hits: int
    errors: int
    bytes_stored: int
    mean_hit_latency: float  # seconds
    mean_miss_latency: float
    l1_entries: int
    code_changes: int = 0  # times a change of the function's code was noticed (docs/keys.md)


class _Stats:
    """Counters; hits of the shells' fast L1 path are kept apart (one increment per hit)."""

    __slots__ = ("bytes_read", "bytes_stored", "code_changes", "error_kinds", "errors",
                 "fast_hits", "fast_time", "fast_timed", "hit_time", "hits", "l1_hits", "miss_time",
                 "misses", "refreshes", "stores")

    def __init__(self) -> None:
        self.hits = self.misses = self.l1_hits = self.errors = self.bytes_stored = 0
        self.fast_hits = self.fast_timed = 0  # fast_time sums the fast_timed sampled hits
        self.stores = self.bytes_read = 0  # backend traffic, for arrowstash.metrics
        self.refreshes = 0  # background refreshes that stored a new value
        self.code_changes = 0
        self.hit_time = self.miss_time = self.fast_time = 0.0
        self.error_kinds: dict[str, int] = {}  # errors by kind (see arrowstash.caching.logs)


def _backend(spec: Backend | str | None) -> Backend | None:
    """The backend an option names: an instance, a URL, None (L1 only) or DEFAULT."""
    if spec is DEFAULT or isinstance(spec, str):  # a store not there yet: UnavailableBackend
        return opened(None if spec is DEFAULT else spec)
    if spec is not None and not isinstance(spec, Backend):
        raise TypeError(f"backend must be a Backend, a URL string, None or DEFAULT, not "
                        f"{type(spec).__qualname__}")
    return spec


#: What a serializer may raise on a damaged entry: a corrupt entry (a miss the caller never
#: sees), not a crash.
_DECODE_ERRORS = (TypeError, ValueError, KeyError, IndexError, OverflowError, AttributeError,
                  MemoryError)


class Prepared(NamedTuple):
    """A value encoded for storing, with its creation and expiry times (0.0: never)."""

    encoded: Encoded
    created: float
    expires: float

    def writer(self, key: Key) -> EntryWriter:
        """What the backend's ``set`` receives."""
        return EntryWriter(key, self.encoded, self.created, self.expires or None)


class _Flights:
    """Per-key locks so that the threads of this process compute a key once."""

    def __init__(self) -> None:
        self._locks: dict[bytes, list[Any]] = {}  # digest -> [lock, users]
        self._guard = threading.Lock()

    def enter(self, digest: bytes) -> bool:
        """Hold the key's lock; return whether another caller held it first."""
        with self._guard:
            slot = self._locks.setdefault(digest, [threading.Lock(), 0])
            slot[1] += 1
        lock = slot[0]
        waited = not lock.acquire(blocking=False)
        if waited:
            lock.acquire()
        return waited

    def leave(self, digest: bytes) -> None:
        with self._guard:
            slot = self._locks[digest]
            slot[0].release()
            slot[1] -= 1
            if not slot[1]:
                del self._locks[digest]


class Core:
    """Everything a call does, in small stages shared by the sync and async shells."""

    def __init__(self, func: Callable[..., Any], options: Options) -> None:
        self.func = func
        self.options = options
        self.name = f"{func.__module__}.{func.__qualname__}"
        namespace = self.namespace = options.namespace
        self.ttl = options.ttl
        self.freshness = Freshness.of(options)
        #: how long entries are kept: past ``ttl`` while they may still be served stale
        self.lifetime = self.ttl if self.freshness is None else self.freshness.lifetime
        self.code = CodeTracker(func) if options.code == "track" else None
        self.keys = KeyMaker(func, f"{self.name}\0{namespace}\0{options.version}\0",
                             options.ignore, options.key, code=self.code,
                             on_code_change=self._code_changed)
        self.backend = _backend(options.backend)
        remote = self.backend is not None and self.backend.capabilities.remote
        self.serializer = resolve(options.serializer).for_backend(remote)
        required = self.backend is not None and self.backend.encrypt
        self.keyring = keyring_for(options.encrypt, options.encryption_key, required,
                                   self.backend)
        self.secret: bytes | None = options.secret or config.secret()
        self.verify = options.verify
        if self._unsafe(self.serializer) and not self.secret and self._shared \
                and self.keyring is None:
            raise ValueError(
                f"serializer {self.serializer.name!r} unpickles, which runs code: on the shared "
                f"backend {self.backend!r} it needs a secret to sign entries (secret= or "
                "ARROWSTASH_SECRET)"
            )
        self._decoders = (
            self.serializer
            if isinstance(self.serializer, AutoSerializer)
            else AutoSerializer(remote)
        )
        self.l1 = L1(options.l1_max_entries, options.l1_max_bytes) if options.l1 else None
        self.lock = options.lock
        self.lock_timeout = options.lock_timeout
        self.strict = options.strict
        self.stats = _Stats()
        self.observer: Observer | None = None  # see caching.observers
        self.flights = _Flights()
        #: async callers in flight, per event loop: a future belongs to the loop that made it
        #: (tasks of other loops, e.g. in other threads, meet at the backend's lock instead)
        self.loop_flights: weakref.WeakKeyDictionary[Any, dict[bytes, Any]] = \
            weakref.WeakKeyDictionary()
        self.background: set[Any] = set()  # refresh tasks running, kept from the GC
        self.log = EventLog(self.name, namespace, self.backend)
        self._parsed: dict[Any, Entry] = {}  # validated headers of unchanged stored entries
        self._key_of: dict[bytes, Key] = {}  # the keys of recent digests
        self._unsafe_names: set[str] = set()  # serializers met that unpickle
        self._by_name: dict[str, Serializer] = {}

    # -- stages -----------------------------------------------------------------------------

    def key(self, digest: bytes) -> Key:
        # Recent keys are kept: making a NamedTuple costs more than a dict lookup, and the same
        # Key object lets the backend's own lookups by key compare by identity.
        key = self._key_of.get(digest)
        if key is None:
            if len(self._key_of) >= _KEYS_KEPT:
                self._key_of.clear()
            key = self._key_of[digest] = tuple.__new__(Key, (self.namespace, self.name, digest))
        return key

    def l1_entry(self, digest: bytes) -> tuple[Any, float]:
        """The value L1 holds for ``digest`` (a private copy where it could change) and its
        expiry, or ABSENT."""
        item = self.l1.get(digest) if self.l1 is not None else None
        if item is None:
            return ABSENT
        return (item.value if item.load is None else item.load()), item.expires

    def read_failed(self, key: Key, exc: BackendError, report: bool) -> tuple[Any, float]:
        if not report:
            return ABSENT
        self._failed("backend_read", "backend read failed", key, exc)
        return DOWN

    def load_entry(self, key: Key, stored: Stored | None, report: bool) -> tuple[Any, float]:
        """The value of a stored entry and its expiry, or MISSING (absent, expired, corrupt)."""
        if stored is None:
            return ABSENT
        data, mapped, fingerprint = stored  # one unpacking: attributes cost a lookup each
        try:
            known = self._parsed.get(fingerprint) if fingerprint else None
            checked = self.verify or not mapped
            entry = parse_entry(data, check_sections=checked, known=known,
                                secret=self.secret)
            if entry.key != key:
                raise CorruptEntryError("entry belongs to another key")
            if known is None and fingerprint:
                if len(self._parsed) >= 256:
                    self._parsed.clear()
                self._parsed[fingerprint] = entry._replace(sections=[])
            header = entry.header
            expires = header.expires
            if expires and expires <= time.time():
                return ABSENT
            sealed = header.flags & FLAG_ENCRYPTED
            if sealed or self.keyring is not None:
                entry = self._decrypt(entry, bool(sealed))
            name = entry.serializer
            decoder = self._by_name.get(name) or self._decoder(name)
            if name in self._unsafe_names and not sealed:
                self._check_trust(entry)
                if self.secret and not checked:  # code runs from these bytes: MAC them all
                    verify_sections(entry, self.secret)
            try:
                value = decoder.decode(entry.meta, entry.sections)
            except _DECODE_ERRORS as exc:
                raise CorruptEntryError(f"undecodable {name} entry: "
                                        f"{type(exc).__name__}: {exc}") from exc
        except (CorruptEntryError, SerializationError) as exc:
            if not report:
                return ABSENT
            self.error("corrupt_entry", "unreadable cache entry, recomputing", key, exc)
            return ABSENT
        self.stats.bytes_read += data.nbytes
        if self.l1 is not None and not mapped:
            self._l1_put(key.digest, value, entry.serializer, entry.meta, entry.sections,
                         expires)
        return value, expires

    def prepare(self, key: Key, value: Any, to_backend: bool = True) -> Prepared | None:
        """Encode ``value`` for storing (signed or to be encrypted as configured); None (after
        logging) when the serializer refuses it."""
        created = time.time()
        expires = created + self.lifetime if self.lifetime is not None else 0.0
        try:
            encoded = self.serializer.encode(value)
            encoded.encrypt_with = self.keyring  # authenticated: no signature needed then
            if self.keyring is None and self.secret:
                encoded.sign_with = self.secret  # every entry: readers refuse unsigned ones
            elif self.keyring is None and self._shared \
                    and self._unsafe(self._decoder(encoded.serializer)):
                raise SerializationError(
                    f"{type(value).__qualname__} values need pickling, which a shared "
                    "backend allows only with a secret (secret= or ARROWSTASH_SECRET)"
                )
            if (self.backend is None or not to_backend) and self.l1 is not None:
                encoded = materialize(encoded)  # L1 is the only store: it needs the bytes
        except SerializationError as exc:
            self.write_failed(key, value, exc)
            return None
        return Prepared(encoded, created, expires)

    def write_failed(self, key: Key, value: Any,
                     exc: SerializationError | BackendError) -> None:
        if isinstance(exc, BackendError):
            self._failed("backend_write", "backend write failed", key, exc)
            return
        if self.strict:
            raise exc
        self.error("serialize", "result not cached", key, exc,
                   topic=f"serialize {type(value).__qualname__}")

    def stored(self, key: Key, value: Any, prepared: Prepared, started: float) -> None:
        """Count a store that began at ``started``, and keep the value in L1."""
        self.stats.stores += 1
        if self.observer is not None:
            self.observer.stored(time.perf_counter() - started)
        if self.l1 is not None:
            encoded = prepared.encoded
            self._l1_put(key.digest, value, encoded.serializer, encoded.meta, encoded.sections,
                         prepared.expires)

    def _l1_put(self, digest: bytes, value: Any, serializer: str, meta: Any,
                sections: list[Any], expires: float) -> None:
        assert self.l1 is not None
        frozen = frozen_size(value)
        if frozen is not None:
            self.l1.put(digest, L1Item(expires, frozen, value, None))
        elif not any(callable(s) for s in sections):  # streamed sections are not kept in memory
            size = sum(memoryview(s).nbytes for s in sections) + 64
            if size <= self.l1.max_bytes:
                # plain containers: copying them is several times cheaper than decoding
                load = copier(value) if serializer == "standard" else None
                if load is not None:
                    self.l1.put(digest, L1Item(expires, size, None, load))
                    return
                decoder = self._decoder(serializer)
                copies = [bytes(s) for s in sections]
                if decoder.mutable_results:
                    # results view their sections: each hit gets private, writable ones
                    def load() -> Any:
                        return decoder.decode(meta, [memoryview(bytearray(s)) for s in copies])
                else:
                    load = functools.partial(decoder.decode, meta, [memoryview(s) for s in copies])
                self.l1.put(digest, L1Item(expires, size, None, load))

    @property
    def _shared(self) -> bool:
        return self.backend is not None and self.backend.capabilities.shared

    @staticmethod
    def _unsafe(serializer: Serializer) -> bool:
        return serializer.executes_code

    def _check_trust(self, entry: Entry) -> None:
        """Refuse to unpickle what this process cannot trust: entries of a code-running
        serializer must be signed when a secret is set, and may be unsigned only locally."""
        if self.secret:
            return  # parse_entry checked its signature
        if self._shared:
            raise CorruptEntryError("pickled entry on a shared backend and no secret to check it")

    def _decrypt(self, entry: Entry, sealed: bool) -> Entry:
        """The entry decrypted; an unencrypted one is refused where encryption is on (anyone
        able to write to the store could plant it)."""
        if self.keyring is None:
            raise CorruptEntryError("entry is encrypted and this function has no key "
                                    "(encrypt=True with ARROWSTASH_KEY or encryption_key=)")
        if not sealed:
            raise CorruptEntryError("unencrypted entry where encryption is required")
        return open_encrypted(entry, self.keyring)

    def _decoder(self, name: str) -> Serializer:
        decoder = self._by_name.get(name)
        if decoder is None:
            decoder = self.serializer if name == self.serializer.name else \
                self._decoders.member(name)
            if self._unsafe(decoder):
                self._unsafe_names.add(name)
            self._by_name[name] = decoder
        return decoder

    def _failed(self, kind: str, message: str, key: Key, exc: BackendError) -> None:
        if self.strict:
            raise exc
        self.error(kind, message, key, exc)

    def error(self, kind: str, message: str, key: Key | None, exc: BaseException | None,
              topic: str | None = None, failure: bool = True) -> None:
        """Count an error of ``kind`` and log it (rate-limited; see arrowstash.caching.logs).
        ``cache_info().errors`` counts failures only, not a lock that was merely slow."""
        stats = self.stats
        stats.errors += failure
        stats.error_kinds[kind] = stats.error_kinds.get(kind, 0) + 1
        self.log.event(kind, message, key=key, exc=exc, topic=topic)

    def lock_failed(self, key: Key, exc: BackendError) -> None:
        """A lock the backend could not take: the caller computes without it."""
        self._failed("backend_lock", "backend lock failed", key, exc)

    def lock_taken(self, key: Key, held: Held) -> None:
        if held is Held.TIMEOUT:
            self.error("lock_timeout", f"stampede lock still held after "
                       f"{self.lock_timeout:g} s; computing anyway", key, None, failure=False)

    def record_hit(self, started: float, layer_l1: bool) -> None:
        stats = self.stats
        stats.hits += 1
        stats.l1_hits += layer_l1
        elapsed = time.perf_counter() - started
        stats.hit_time += elapsed
        if not layer_l1 and self.observer is not None:
            self.observer.backend_hit(elapsed)

    def record_miss(self, started: float) -> None:
        elapsed = time.perf_counter() - started
        self.stats.misses += 1
        self.stats.miss_time += elapsed
        if self.observer is not None:
            self.observer.miss(elapsed)

    def info(self) -> CacheInfo:
        s = self.stats
        hits = s.hits + s.fast_hits
        return CacheInfo(
            hits, s.misses, s.l1_hits + s.fast_hits, s.errors, s.bytes_stored,
            (s.hit_time + s.fast_time / s.fast_timed * s.fast_hits if s.fast_timed
             else s.hit_time) / hits if hits else 0.0,
            s.miss_time / s.misses if s.misses else 0.0,
            len(self.l1) if self.l1 is not None else 0,
            s.code_changes,
        )

    def _code_changed(self) -> None:
        """The code behind the function changed: its old entries are never served again."""
        self.stats.code_changes += 1
        if self.l1 is not None:
            self.l1.clear()
        fingerprint = self.code.fingerprint.hex()[:12] if self.code and self.code.fingerprint \
            else ""
        self.log.event("code_changed", "code changed (the function or a helper it reaches was "
                       "redefined): recomputing, entries of the old code are not served",
                       topic=f"code {fingerprint}", level=logging.INFO)

    def clear(self) -> int:
        if self.l1 is not None:
            self.l1.clear()
        if self.backend is None:
            return 0
        return self.backend.clear(self.namespace, self.name)

    def forget(self, digest: bytes) -> bool:
        if self.l1 is not None:
            self.l1.pop(digest)
        return self.backend.delete(self.key(digest)) if self.backend is not None else False
