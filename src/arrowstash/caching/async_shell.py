"""The shell of a cached coroutine function: the same call operation, run by the async driver
(backend I/O and long encoding or decoding off the event loop); asyncio loads only here."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

from arrowstash.caching import async_driver
from arrowstash.caching import operations as ops
from arrowstash.caching.pipeline import Core
from arrowstash.caching.sync_shell import CachedFunction


class AsyncCachedFunction(CachedFunction):
    """Awaited like the original; the entry-managing verbs are the sync shell's."""

    def __init__(self, core: Core) -> None:
        super().__init__(core)
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
        return await async_driver.run(core, ops.call(core, digest, args, kwargs, started))

    async def refresh(self, *args: Any, **kwargs: Any) -> Any:
        """Recompute one call, store the result and return it."""
        key = self.cache_key(*args, **kwargs)
        return await async_driver.run(self._core, ops.recompute(self._core, key, args, kwargs))
