"""The async shell of ``@cache``: the same stages, with backend I/O and waits off the event loop."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

from arrowstash._core import MISSING, UNREACHABLE, Core
from arrowstash.backends.base import Held
from arrowstash.decorator import CachedFunction
from arrowstash.entry import Key


class AsyncCachedFunction(CachedFunction):
    """The async shell: the same stages, with backend I/O and waits run off the event loop."""

    def __init__(self, core: Core) -> None:
        super().__init__(core)
        self._flights: dict[bytes, asyncio.Future[None]] = {}
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
        value = await asyncio.to_thread(core.backend_get, key)
        return await self._miss(key, value, args, kwargs, started)

    async def _miss(self, key: Key, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    started: float) -> Any:
        """After the first look: ``value`` is what it found, or MISSING, or UNREACHABLE."""
        core = self._core
        digest = key.digest
        if value is UNREACHABLE:
            value = await core.func(*args, **kwargs)
            await asyncio.to_thread(core.store, key, value, False)
            core.record_miss(started)
            return value
        while True:
            if value is not MISSING:
                core.record_hit(started, False)
                return value
            pending = self._flights.get(digest)
            if pending is None:
                break
            await asyncio.shield(pending)  # another task is computing it: wait, then look again
            value = await asyncio.to_thread(self._lookup, key)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flights[digest] = done
        try:
            return await self._compute_locked(key, args, kwargs, started)
        finally:
            del self._flights[digest]
            done.set_result(None)

    async def _compute_locked(self, key: Key, args: tuple[Any, ...], kwargs: dict[str, Any],
                              started: float) -> Any:
        core = self._core
        lock = core.locked(key)
        held = await asyncio.to_thread(lock.__enter__)
        try:
            if held is not Held.FREE:
                value = await asyncio.to_thread(core.backend_get, key, False)
                if value is not MISSING:
                    core.record_hit(started, False)
                    return value
            value = await core.func(*args, **kwargs)
            await asyncio.to_thread(core.store, key, value)
            core.record_miss(started)
            return value
        finally:
            await asyncio.to_thread(lock.__exit__, None, None, None)

    async def refresh(self, *args: Any, **kwargs: Any) -> Any:
        key = self.cache_key(*args, **kwargs)
        value = await self._core.func(*args, **kwargs)
        await asyncio.to_thread(self._core.store, key, value)
        return value
