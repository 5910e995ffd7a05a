"""The async shell of ``@cache``: the same stages, with backend I/O and waits off the event loop.

A backend with async verbs (``aget``, ``aset``, ``alock``: Redis on redis.asyncio) is awaited
directly; with any other backend those stages run in a worker thread. Decoding and encoding stay
off the loop where they may take long (large entries).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any, cast

from arrowstash.backends.base import AsyncBackend, Held
from arrowstash.caching.pipeline import MISSING, UNREACHABLE, Core
from arrowstash.caching.sync_shell import CachedFunction
from arrowstash.entry.format import Key
from arrowstash.errors import BackendError, SerializationError


class AsyncCachedFunction(CachedFunction):
    """The async shell: the same stages, with backend I/O and waits run off the event loop."""

    def __init__(self, core: Core) -> None:
        super().__init__(core)
        # computations in flight, per event loop: a future belongs to the loop that made it
        # (tasks of other loops, e.g. in other threads, meet at the backend's lock instead)
        self._flights: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[bytes, asyncio.Future[None]]
        ] = weakref.WeakKeyDictionary()
        backend = core.backend
        native = backend is not None and backend.capabilities.async_io
        aio = cast(AsyncBackend, backend)
        self._aget = aio.aget if native else None
        self._aset = aio.aset if native else None
        self._alock = aio.alock if native else None
        if hasattr(inspect, "markcoroutinefunction"):  # Python 3.12+
            inspect.markcoroutinefunction(self)
        else:
            self._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
            # Before 3.12, inspect sees a coroutine function in any "function-like" callable:
            # one with a code object flagged as a coroutine's, and defaults like a function's.
            func = core.func
            self.__code__ = func.__code__
            self.__defaults__ = getattr(func, "__defaults__", None)
            self.__kwdefaults__ = getattr(func, "__kwdefaults__", None)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        core = self._core
        started = time.perf_counter()
        digest = core.keys(args, kwargs)
        value = core.l1_get(digest)
        if value is not MISSING:
            core.record_hit(started, True)
            return value
        key = core.key(digest)
        value, _expires = await self._entry(key)
        return await self._miss(key, value, args, kwargs, started)

    # -- the stages that touch the backend ----------------------------------------------------

    async def _entry(self, key: Key, report: bool = True) -> tuple[Any, float]:
        """Core.backend_entry, awaited."""
        core = self._core
        if self._aget is None:
            return await asyncio.to_thread(core.backend_entry, key, report)
        try:
            stored = await self._aget(key)
        except BackendError as exc:
            return core.read_failed(key, exc, report)
        if stored is not None and stored.data.nbytes >= _DECODE_ASIDE:
            return await asyncio.to_thread(core.load_entry, key, stored, report)
        return core.load_entry(key, stored, report)

    async def _lookup_async(self, key: Key) -> Any:
        """The second look of a miss: L1, then the backend (failures already reported)."""
        value = self._core.l1_get(key.digest)
        return value if value is not MISSING else (await self._entry(key, False))[0]

    async def _store(self, key: Key, value: Any, to_backend: bool = True) -> None:
        """Core.store, awaited: encoding in a worker thread (it may be long), then the write."""
        core = self._core
        if self._aset is None or not to_backend or core.backend is None:
            await asyncio.to_thread(core.store, key, value, to_backend)
            return
        started = time.perf_counter()
        prepared = await asyncio.to_thread(core.prepare, key, value, to_backend)
        if prepared is None:
            return
        try:
            core.stats.bytes_stored += await self._aset(
                key, prepared.encoded, created=prepared.created,
                expires=prepared.expires or None)
        except (SerializationError, BackendError) as exc:
            core.write_failed(key, value, exc)
            return
        core.stored(key, value, prepared, started)

    @contextlib.asynccontextmanager
    async def _locked(self, key: Key) -> AsyncIterator[Held]:
        """Core.locked, awaited: held across the function's run, released even on errors."""
        core = self._core
        if self._alock is None or core.backend is None or not core.lock:
            lock = core.locked(key)
            held = await asyncio.to_thread(lock.__enter__)
            try:
                yield held
            finally:
                await asyncio.to_thread(lock.__exit__, None, None, None)
            return
        entered = False
        try:
            async with self._alock(key, core.lock_timeout) as held:
                entered = True
                core.lock_taken(key, held)
                yield held
        except BackendError as exc:
            if entered:
                raise
            core.lock_failed(key, exc)
            yield Held.TIMEOUT

    async def _miss(self, key: Key, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    started: float) -> Any:
        """After the first look: ``value`` is what it found, or MISSING, or UNREACHABLE."""
        core = self._core
        digest = key.digest
        if value is UNREACHABLE:
            value = await core.func(*args, **kwargs)
            await self._store(key, value, False)
            core.record_miss(started)
            return value
        loop = asyncio.get_running_loop()
        flights = self._flights.get(loop)
        if flights is None:
            flights = self._flights.setdefault(loop, {})
        while True:
            if value is not MISSING:
                core.record_hit(started, False)
                return value
            pending = flights.get(digest)
            if pending is None:
                break
            await asyncio.shield(pending)  # another task is computing it: wait, then look again
            value = await self._lookup_async(key)
        done: asyncio.Future[None] = loop.create_future()
        flights[digest] = done
        try:
            return await self._compute_locked(key, args, kwargs, started)
        finally:
            del flights[digest]
            done.set_result(None)

    async def _compute_locked(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any],
                              started: float) -> Any:
        core = self._core
        async with self._locked(key) as held:
            if held is not Held.FREE:  # another process may have stored it meanwhile
                value, _expires = await self._entry(key, False)
                if value is not MISSING:
                    core.record_hit(started, False)
                    return value
            value = await core.func(*args, **kwargs)
            await self._store(key, value)
            core.record_miss(started)
            return value

    async def refresh(self, *args: Any, **kwargs: Any) -> Any:
        key = self.cache_key(*args, **kwargs)
        value = await self._core.func(*args, **kwargs)
        await self._store(key, value)
        return value


#: Entries at least this large are decoded in a worker thread, off the event loop.
_DECODE_ASIDE = 1 << 20
