"""The shells of functions with ``stale_ttl=`` or ``refresh_ahead=`` (see freshness.py):
a hit that is due for a refresh returns at once and starts one in the background, a thread for
sync functions and a task for async ones.

One refresh per key at a time: in this process by the policy's claim, across processes by the
backend's stampede lock (the refresh holds it like a miss does; whoever gets it second finds the
entry fresh and stops). A failed refresh keeps the stale value, is logged and counted, and never
reaches a caller.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from arrowstash.caching.async_shell import AsyncCachedFunction
from arrowstash.caching.freshness import Freshness
from arrowstash.caching.pipeline import MISSING, UNREACHABLE, Core
from arrowstash.caching.sync_shell import CachedFunction
from arrowstash.entry.format import Key


class _Refreshing:
    """What both shells share: finding a hit with its expiry, and the end of a refresh."""

    _core: Core
    _freshness: Freshness

    def _l1_hit(self, digest: bytes) -> tuple[Any, float]:
        core = self._core
        item = core.l1.get(digest) if core.l1 is not None else None
        if item is None:
            return MISSING, 0.0
        return (item.value if item.load is None else item.load()), item.expires

    def _due(self, expires: float, digest: bytes) -> bool:
        """Whether a hit should start a refresh (and this caller claimed it)."""
        return self._freshness.due(expires, time.time()) and self._freshness.claim(digest)

    def _fresh_elsewhere(self, key: Key) -> bool:
        """Whether another process refreshed the entry meanwhile (its value is then in L1)."""
        value, expires = self._core.backend_entry(key, report=False)
        return value is not MISSING and not self._freshness.due(expires, time.time())

    def _failed(self, key: Key, exc: Exception) -> None:
        self._core.error("refresh", "background refresh failed, the stale value stays", key, exc)


class FreshCachedFunction(_Refreshing, CachedFunction):
    def __init__(self, core: Core) -> None:
        super().__init__(core)
        assert core.freshness is not None
        self._freshness = core.freshness
        self._fast = None  # the fast L1 path does not look at expiry this closely

    def _resolve(self, digest: bytes, args: tuple[Any, ...], kwargs: dict[str, Any],
                 started: float) -> Any:
        core = self._core
        value, expires = self._l1_hit(digest)
        layer_l1 = value is not MISSING
        key = core.key(digest)
        if not layer_l1:
            value, expires = core.backend_entry(key)
            if value is MISSING or value is UNREACHABLE:
                return self._miss(key, value, args, kwargs, started)
        if self._due(expires, digest):
            threading.Thread(target=self._refresh_in_background, args=(key, args, kwargs),
                             name=f"arrowstash refresh of {core.name}", daemon=True).start()
        core.record_hit(started, layer_l1)
        return value

    def _refresh_in_background(self, key: Key, args: tuple[Any, ...],
                               kwargs: dict[str, Any]) -> None:
        core = self._core
        try:
            with core.locked(key) as held:
                if held and not self._fresh_elsewhere(key):
                    value = core.func(*args, **kwargs)
                    core.stats.refreshes += 1  # counted before the new value shows
                    core.store(key, value)
        except Exception as exc:  # the function's own errors: a background thread ends here
            self._failed(key, exc)
        finally:
            self._freshness.release(key.digest)


class FreshAsyncCachedFunction(_Refreshing, AsyncCachedFunction):
    def __init__(self, core: Core) -> None:
        super().__init__(core)
        assert core.freshness is not None
        self._freshness = core.freshness
        self._tasks: set[asyncio.Task[None]] = set()  # running refreshes, kept from the GC

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        core = self._core
        started = time.perf_counter()
        digest = core.keys(args, kwargs)
        value, expires = self._l1_hit(digest)
        layer_l1 = value is not MISSING
        key = core.key(digest)
        if not layer_l1:
            value, expires = await self._entry(key)
            if value is MISSING or value is UNREACHABLE:
                return await self._miss(key, value, args, kwargs, started)
        if self._due(expires, digest):
            task = asyncio.get_running_loop().create_task(
                self._refresh_in_background(key, args, kwargs))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        core.record_hit(started, layer_l1)
        return value

    async def _refresh_in_background(self, key: Key, args: tuple[Any, ...],
                                     kwargs: dict[str, Any]) -> None:
        core = self._core
        try:
            async with self._locked(key) as held:
                if held and not await asyncio.to_thread(self._fresh_elsewhere, key):
                    value = await core.func(*args, **kwargs)
                    core.stats.refreshes += 1
                    await self._store(key, value)
        except Exception as exc:  # the function's own errors: the task ends here
            self._failed(key, exc)
        finally:
            self._freshness.release(key.digest)
