"""The backend protocol: a store of whole entries, addressed by :class:`~arrowstash.entry.Key`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple, Protocol, runtime_checkable

from arrowstash.entry.format import EntryWriter, Key
from arrowstash.entry.listing import EntryInfo


class Stored(NamedTuple):
    """Bytes of one entry as read from a backend.

    ``mapped`` says the buffer is a private memory map of a file written atomically; readers then
    skip hashing its sections, which would touch every page of a value that may be used in part.
    """

    data: memoryview
    mapped: bool = False
    #: Identifies the stored bytes (a file entry's header, which holds the checksum of header and
    #: trailer, and its creation time) so that a reader may reuse
    #: its parse of an unchanged entry; None where the store has no such identity.
    fingerprint: Any = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do, declared by its class; the pipeline, the serializers and the
    contract suite read these flags and never probe for methods."""

    #: Others (processes of other users, other machines) can write entries: entries whose
    #: loading runs code need a secret, and the stampede lock must exclude them too.
    shared: bool
    #: Entries cross a network: frames are compressed by default.
    remote: bool
    #: ``set`` writes streamed sections straight to the store, never holding the whole entry.
    streams_writes: bool
    #: ``get`` may hand back a private memory map (``Stored.mapped``).
    maps_reads: bool
    #: ``entries`` and ``stats`` see every stored entry, and ``clear`` counts what it deletes.
    lists_entries: bool
    #: The store expires entries by itself (the header's expiry is checked on reads anyway).
    native_ttl: bool
    #: ``aget``/``aset``/``alock`` exist: an :class:`AsyncBackend`.
    async_io: bool = False
    #: The backend guards its store with a circuit breaker, whose state is ``breaker.state``
    #: (a :class:`Breakered`): metrics export it.
    breaker: bool = False
    #: The backend refuses a store that other users can write (owner and permissions of its
    #: folders, checked at first use) unless it is shared on purpose; an instance that accepted
    #: such a store declares ``shared`` in its own ``capabilities``.
    checks_owner: bool = False


class Held(IntEnum):
    """What taking a stampede lock gave; false only when it timed out."""

    TIMEOUT = 0
    FREE = 1  # taken at the first try: nobody else was computing
    WAITED = 2  # taken after waiting: the holder may have stored the value meanwhile


def _pauses(timeout: float) -> Iterator[float]:
    """The pauses between attempts at a lock: growing from 1 ms to 50 ms, until ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while time.monotonic() < deadline:
        yield delay
        delay = min(delay * 2, 0.05)


def take_lock(attempt: Callable[[], bool], timeout: float) -> Held:
    """Call ``attempt`` with a growing pause until it takes the lock or ``timeout`` passes."""
    if attempt():
        return Held.FREE
    for pause in _pauses(timeout):
        time.sleep(pause)
        if attempt():
            return Held.WAITED
    return Held.TIMEOUT


async def atake_lock(attempt: Callable[[], Awaitable[bool]], timeout: float) -> Held:
    """:func:`take_lock` for an async ``attempt``: waits without blocking the event loop."""
    import asyncio

    if await attempt():
        return Held.FREE
    for pause in _pauses(timeout):
        await asyncio.sleep(pause)
        if await attempt():
            return Held.WAITED
    return Held.TIMEOUT


@runtime_checkable
class Backend(Protocol):
    """A cache store. Implementations raise :class:`~arrowstash.BackendError` on store failures.

    ``set`` receives an :class:`~arrowstash.entry.format.EntryWriter` rather than bytes: a
    backend able to stream (the File backend) writes the sections straight to their destination,
    others collect the entry in one buffer. Only the entry package builds or parses entry bytes.
    """

    capabilities: Capabilities
    #: Every cached function using this backend encrypts its entries (docs/encryption.md).
    encrypt: bool

    def get(self, key: Key) -> Stored | None: ...

    def set(self, entry: EntryWriter) -> int:
        """Store the entry (under ``entry.key``); return its size in bytes."""

    def delete(self, key: Key) -> bool: ...

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        """Delete our entries (of one namespace, or one function of it); return how many."""

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]: ...

    def stats(self) -> dict[str, Any]: ...

    def lock(self, key: Key, timeout: float) -> AbstractContextManager[Held]:
        """Hold the stampede lock of ``key``, or give up after ``timeout`` (Held.TIMEOUT)."""


class BreakerState(Protocol):
    @property
    def state(self) -> str: ...


class Breakered(Backend, Protocol):
    """A backend declaring ``capabilities.breaker``."""

    breaker: BreakerState


@runtime_checkable
class AsyncBackend(Backend, Protocol):
    """A backend with async verbs (``capabilities.async_io``), awaited by async functions
    instead of running the sync verbs in a worker thread."""

    async def aget(self, key: Key) -> Stored | None: ...

    async def aset(self, entry: EntryWriter) -> int: ...

    def alock(self, key: Key, timeout: float) -> AbstractAsyncContextManager[Held]: ...
