"""What a cached call does, written once for sync and async functions.

Each operation is a generator: it yields a *step* wherever it needs the backend, the function
or a wait, and is sent the step's result (or has its exception thrown in). A driver runs the
steps: ``sync_driver`` calls them directly, ``async_driver`` awaits them (the backend's async
verbs where it declares them, else a worker thread). Everything else (keys, L1, decoding,
counters, logs) is the pipeline's plain code in ``pipeline.Core``.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

from arrowstash.backends.base import Held, Stored
from arrowstash.caching.pipeline import ABSENT, MISSING, UNREACHABLE, Core, Prepared
from arrowstash.entry.format import Key
from arrowstash.errors import BackendError, SerializationError

#: Entries at least this large are decoded off an async caller's event loop.
DECODE_ASIDE = 1 << 20


# The steps. An operation yields a plain tuple headed by the step's kind, e.g. ``(Get, key)``:
# a NamedTuple's constructor would cost more than its driver's work (a sixth of a store).


class Get:
    """``(Get, key)``: read the stored bytes of ``key`` (Stored or None; BackendError thrown
    in)."""


class Put:
    """``(Put, key, prepared)``: write a prepared entry; sent its size in bytes."""


class Aside:
    """``(Aside, func, args)``: run ``func(*args)``, which may take long (encoding, decoding a
    large entry): inline for sync callers, in a worker thread for async ones."""


class Call:
    """``(Call, args, kwargs)``: run the cached function itself (awaited for an async one)."""


class Join:
    """``(Join, digest)``: become this process's one computer of ``digest``; sent whether
    another caller held it first (then it may have stored the value meanwhile)."""


class Leave:
    """``(Leave, digest)``: end what Join began."""


class Lock:
    """``(Lock, key)``: take the backend's stampede lock of ``key``: sent a Held (TIMEOUT where
    the lock could not be taken, after logging why)."""


class Unlock:
    """``(Unlock, key)``: release what Lock took, if it took it."""


class Spawn:
    """``(Spawn, operation)``: run another operation in the background (a thread, or a task on
    the caller's loop)."""


#: A step: its kind (one of the classes above), then its fields.
Step = tuple[Any, ...]
Op = Generator[Any, Any, Any]


#: A call's first look, as ``call`` takes it from a driver that took it itself: the value (or
#: MISSING, UNREACHABLE), its expiry, and whether L1 held it. A plain tuple: a NamedTuple's
#: constructor would cost a tenth of a File hit.
Looked = tuple[Any, float, bool]


def settled(core: Core, looked: Looked, started: float) -> bool:
    """Whether a first look ends the call with no step left, as ``call`` would end it: a value
    found and no refresh policy to consult. The hit is then counted."""
    value = looked[0]
    if value is MISSING or value is UNREACHABLE or core.freshness is not None:
        return False
    core.record_hit(started, looked[2])
    return True


def call(core: Core, digest: bytes, args: tuple[Any, ...], kwargs: dict[str, Any],
         started: float, looked: Looked | None = None) -> Op:
    """A call of the cached function: a hit from L1 or the backend, else a miss. ``looked`` is
    the first look (L1, then the backend) when the driver has taken it (see ``Looked``)."""
    key = core.key(digest)
    if looked is not None:
        value, expires, layer_l1 = looked
    else:
        value, expires = core.l1_entry(digest)
        layer_l1 = value is not MISSING
        if not layer_l1:
            value, expires = yield from read(core, key, report=True)
    if not layer_l1:
        if value is UNREACHABLE:  # the backend is failing: compute without it
            value = yield Call, args, kwargs
            yield from store(core, key, value, to_backend=False)
            core.record_miss(started)
            return value
        if value is MISSING:
            return (yield from miss(core, key, args, kwargs, started))
    freshness = core.freshness
    if freshness is not None and freshness.due(expires, time.time()) \
            and freshness.claim(digest):
        yield Spawn, refresh_in_background(core, key, args, kwargs)
    core.record_hit(started, layer_l1)
    return value


def miss(core: Core, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any],
         started: float) -> Op:
    """After a first look found nothing: one caller per key computes, the others wait for its
    value (threads and tasks in this process, then other processes through the backend)."""
    waited = yield Join, key.digest
    try:
        if waited:  # another caller may have stored it while we waited
            value = core.l1_entry(key.digest)[0]
            if value is MISSING:
                value = (yield from read(core, key, report=False))[0]
            if value is not MISSING:
                core.record_hit(started, False)
                return value
        held = yield Lock, key
        try:
            if held is not Held.FREE:  # another process may have stored it meanwhile
                value = (yield from read(core, key, report=False))[0]
                if value is not MISSING:
                    core.record_hit(started, False)
                    return value
            value = yield Call, args, kwargs
            yield from store(core, key, value)
            core.record_miss(started)
            return value
        finally:
            yield Unlock, key
    finally:
        yield Leave, key.digest


def read(core: Core, key: Key, report: bool) -> Op:
    """The stored value of ``key`` and its expiry, or MISSING (absent, expired, corrupt). With
    ``report`` (a call's first look) failures are logged and counted, and a failing backend
    gives UNREACHABLE, so that the call spends no more time on it."""
    if core.backend is None:
        return ABSENT
    try:
        stored: Stored | None = yield Get, key
    except BackendError as exc:
        return core.read_failed(key, exc, report)
    if stored is not None and stored.data.nbytes >= DECODE_ASIDE:
        return (yield Aside, core.load_entry, (key, stored, report))
    return core.load_entry(key, stored, report)


def store(core: Core, key: Key, value: Any, to_backend: bool = True) -> Op:
    """Encode ``value`` and store it (in L1 too); a refusal or failure is logged, not raised,
    unless the function is strict."""
    started = time.perf_counter()
    prepared: Prepared | None = yield Aside, core.prepare, (key, value, to_backend)
    if prepared is None:
        return
    if core.backend is not None and to_backend:
        try:
            core.stats.bytes_stored += yield Put, key, prepared
        except (SerializationError, BackendError) as exc:
            core.write_failed(key, value, exc)
            return
    core.stored(key, value, prepared, started)


def recompute(core: Core, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Op:
    """``refresh()``: run the function and store its value, whatever is stored."""
    value = yield Call, args, kwargs
    yield from store(core, key, value)
    return value


def refresh_in_background(core: Core, key: Key, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Op:
    """A hit's refresh (``stale_ttl``, ``refresh_ahead``): one per key at a time, in this
    process by the freshness claim, across processes by the stampede lock (whoever gets it
    second finds the entry fresh and stops). A failure keeps the stale value and is logged."""
    freshness = core.freshness
    assert freshness is not None
    try:
        held = yield Lock, key
        try:
            if held:
                value, expires = yield from read(core, key, report=False)
                if value is MISSING or freshness.due(expires, time.time()):
                    value = yield Call, args, kwargs
                    core.stats.refreshes += 1  # counted before the new value shows
                    yield from store(core, key, value)
        finally:
            yield Unlock, key
    except Exception as exc:  # the function's own errors: a background refresh ends here
        core.error("refresh", "background refresh failed, the stale value stays", key, exc)
    finally:
        freshness.release(key.digest)
