"""``@cache``: the decorator and its sync shell (the stages of a call live in ``_core``)."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from arrowstash.backends.base import Backend
from arrowstash.caching import observers
from arrowstash.caching.options import DEFAULT, Options
from arrowstash.caching.pipeline import CacheInfo, Core
from arrowstash.caching.sync_shell import CachedFunction
from arrowstash.entry.crypto import KeySpec
from arrowstash.serializers.base import Serializer

__all__ = ["DEFAULT", "CacheInfo", "CachedFunction", "cache"]

F = TypeVar("F", bound=Callable[..., Any])


@overload
def cache(func: F, /) -> F: ...


@overload
def cache(
    *,
    ttl: float | dt.timedelta | None = ...,
    namespace: str = ...,
    version: str | int | None = ...,
    backend: Backend | str | None = ...,
    serializer: str | Serializer = ...,
    l1: bool = ...,
    l1_max_entries: int = ...,
    l1_max_bytes: int = ...,
    key: Callable[..., Any] | None = ...,
    ignore: Iterable[str] = ...,
    code: str = ...,
    lock: bool = ...,
    lock_timeout: float = ...,
    strict: bool = ...,
    secret: str | bytes | None = ...,
    encrypt: bool | None = ...,
    encryption_key: KeySpec | None = ...,
    verify: bool = ...,
    stale_ttl: float | dt.timedelta | None = ...,
    refresh_ahead: float | None = ...,
) -> Callable[[F], F]: ...


def cache(
    func: Any = None,
    /,
    *,
    ttl: float | dt.timedelta | None = None,
    namespace: str = "default",
    version: str | int | None = None,
    backend: Backend | str | None = DEFAULT,
    serializer: str | Serializer = "auto",
    l1: bool = True,
    l1_max_entries: int = 1024,
    l1_max_bytes: int = 64 << 20,
    key: Callable[..., Any] | None = None,
    ignore: Iterable[str] = (),
    code: str = "track",
    lock: bool = True,
    lock_timeout: float = 60.0,
    strict: bool = False,
    secret: str | bytes | None = None,
    encrypt: bool | None = None,
    encryption_key: KeySpec | None = None,
    verify: bool = False,
    stale_ttl: float | dt.timedelta | None = None,
    refresh_ahead: float | None = None,
) -> Any:
    """Cache a function's results by its arguments (see docs/decorator.md).

    Each option is described, defaulted and validated in
    :class:`arrowstash.caching.options.Options`: a bad value fails here, when the decorator is
    applied. ``backend`` takes a Backend, a URL string, ``None`` (this process only) or DEFAULT
    (``ARROWSTASH_URL``, else a File backend in the user's cache folder).
    """
    # The parameters are the fields of Options (tests/test_options.py holds them equal), so the
    # call's locals are exactly the options: validated once, there.
    options = Options(**{name: value for name, value in locals().items() if name != "func"})

    def decorate(f: Any) -> Any:
        if isinstance(f, (staticmethod, classmethod)):
            return type(f)(decorate(f.__func__))
        if not callable(f):
            raise TypeError(f"@cache needs a function, not {type(f).__qualname__}")
        if inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f):
            raise TypeError(
                f"@cache cannot cache the generator function {f.__qualname__}: calling it "
                f"returns a generator, which runs lazily and can be consumed once; cache a "
                f"function that returns a list (e.g. list({f.__name__}(...))) instead"
            )
        core = Core(f, options)
        observers.register(core)
        if inspect.iscoroutinefunction(f):
            from arrowstash.caching.async_shell import AsyncCachedFunction  # loads asyncio

            return AsyncCachedFunction(core)
        return CachedFunction(core)

    return decorate if func is None else decorate(func)
