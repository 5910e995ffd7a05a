"""The shell of a cached function: the inlined L1 fast path, then the call operation (see
``operations``) run by the sync driver, and the verbs that manage a function's entries."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

from arrowstash.caching import observers, sync_driver
from arrowstash.caching import operations as ops
from arrowstash.caching.code import CodeTracker
from arrowstash.caching.pipeline import CacheInfo, Core
from arrowstash.entry.format import Key

_clock = time.perf_counter
_now = time.time


class CachedFunction:
    """A cached function: call it like the original; the methods below manage its entries."""

    # What every call reads, in slots: an attribute of the instance dict
    # (which functools.update_wrapper fills) costs a dict lookup each time.
    __slots__ = ("__dict__", "__weakref__", "_code", "_core", "_fast", "_keys", "_recency",
                 "_stats")

    def __init__(self, core: Core) -> None:
        self._core = core
        # bound once: the fast path reads them on every call
        self._stats = core.stats
        # the key maker's bound __call__: calling the instance itself goes through its type's
        # call slot, a Python-level lookup on every call
        self._keys: Callable[[tuple[Any, ...], dict[str, Any]], bytes] = core.keys.__call__
        # the fast path does not look at expiry closely enough for background refreshes
        self._fast = core.l1.fast if core.l1 is not None and core.freshness is None else None
        self._recency: Callable[..., object] = (
            core.l1.items.move_to_end if core.l1 is not None else bytes
        )
        # the fast path's test of rebound helpers (caching.code); None while the tracker reads
        # no global of the function's module, where the test could never fail (see _call)
        self._code: CodeTracker | None = None
        self.uncached = core.func
        functools.update_wrapper(self, core.func)

    def __repr__(self) -> str:
        return f"<cached {self._core.name} backend={self._core.backend!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by name where its module holds it (the worker imports it, as pickle does
        for functions); else as the original function and its options, the backend resolved
        here: a backend pickles as what reopens it (a folder, an object-store URL), so a
        cached function sent to a Dask worker process finds its store there."""
        func = self._core.func
        module, name = func.__module__, func.__qualname__
        if module != "__main__" and _named(module, name) is self:
            return (_named, (module, name))
        options = dataclasses.replace(self._core.options, backend=self._core.backend)
        return (_rebuilt, (func, options))

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return _Bound(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The L1 hit of plain positional arguments, inlined: the path that must cost well under
        # a microsecond. Anything else (and every miss) takes the canonical key in _call.
        fast = self._fast
        if not kwargs and fast is not None:
            stats = self._stats
            # One fast hit in 64 is timed (two clock reads would be a sixth of the hit); the
            # mean hit latency of cache_info() extrapolates from those.
            sampled = not stats.fast_hits & 63
            started = _clock() if sampled else 0.0
            code = self._code
            try:
                # a helper rebound (a notebook cell) sends the call to _call, which notices
                found = fast.get(args) if code is None or code.get(code.scope) == code.seen \
                    else None
            except (TypeError, KeyError, ValueError):  # unhashable arguments, a global deleted
                found = None
            if found is not None:
                types, item = found
                expires = item.expires
                # 1, 1.0 and True are equal dict keys but different arguments: compare types
                # (one-argument calls without building a tuple)
                if (type(args[0]) is types[0] if len(args) == 1
                        else types == tuple(map(type, args))) \
                        and (not expires or expires > _now()):
                    try:  # noqa: SIM105 (contextlib.suppress would cost a third of the hit)
                        self._recency(item.digest)
                    except KeyError:  # dropped by another thread meanwhile: still valid now
                        pass
                    load = item.load
                    value = item.value if load is None else load()
                    stats.fast_hits += 1
                    if sampled:
                        stats.fast_timed += 1
                        stats.fast_time += _clock() - started
                    return value
        return self._call(args, kwargs)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        core = self._core
        started = _clock()
        digest = self._keys(args, kwargs)
        value = sync_driver.call(core, digest, args, kwargs, started)
        if not kwargs and self._fast is not None:
            # Fast entries exist only after a _call, and a new fingerprint clears L1 (fast
            # entries too): so the test the fast path needs is settled here, for the globals
            # the tracker reads now.
            code = core.code
            self._code = code if code is not None and code.scope else None
            core.l1.alias(args, digest)  # type: ignore[union-attr]  # the next such call is fast
        return value

    def cache_key(self, *args: Any, **kwargs: Any) -> Key:
        """The key a call with these arguments uses."""
        return self._core.key(self._core.keys(args, kwargs))

    def cache_info(self) -> CacheInfo:
        return self._core.info()

    def cache_clear(self) -> int:
        """Delete this function's entries (every version) from L1 and the backend."""
        return self._core.clear()

    def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Delete the entry of one call; return whether the backend held it."""
        return self._core.forget(self._core.keys(args, kwargs))

    def refresh(self, *args: Any, **kwargs: Any) -> Any:
        """Recompute one call, store the result and return it."""
        key = self.cache_key(*args, **kwargs)
        return sync_driver.run(self._core, ops.recompute(self._core, key, args, kwargs))


def _named(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names, or None."""
    found: Any = sys.modules.get(module)
    if found is None:
        try:
            found = importlib.import_module(module)
        except ImportError:
            return None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def _rebuilt(func: Callable[..., Any], options: Any) -> CachedFunction:
    """A cached function unpickled from its parts (see CachedFunction.__reduce__)."""
    core = Core(func, options)
    observers.register(core)
    return CachedFunction(core)


class _Bound:
    """A cached method bound to its instance: every verb gets the instance as first argument."""

    __slots__ = ("_cached", "_obj")

    def __init__(self, cached: CachedFunction, obj: Any) -> None:
        self._cached = cached
        self._obj = obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached(self._obj, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._cached, name)
        if name in ("invalidate", "refresh", "cache_key"):
            return functools.partial(attr, self._obj)
        return attr
