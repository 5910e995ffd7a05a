"""The in-process first layer: a thread-safe LRU bounded by entries and bytes, honouring TTL.

Entries are keyed by the call's digest. Calls whose positional arguments are all plain scalars
also find their entry through ``fast``, a dict keyed by the argument tuple itself, so that a
hit skips the canonical key encoding; the argument types are checked too, because ``1``,
``1.0`` and ``True`` are equal dict keys but different cache keys.
"""

from __future__ import annotations

import datetime as dt
import decimal
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

#: Types whose values never change: kept and returned as themselves.
_SCALARS = frozenset({
    type(None), bool, int, float, complex, str, bytes,
    dt.date, dt.datetime, dt.time, dt.timedelta, decimal.Decimal, uuid.UUID,
})
#: Argument types that may key ``fast``. Among them only int, bool and float compare equal
#: across types, which the type check on every fast hit tells apart.
_KEYABLE = frozenset({type(None), bool, int, float, str, bytes})
#: How many argument tuples may lead to one entry (``f(1)`` and ``f(1, 2)`` when 2 is the
#: default; ignored parameters); more fall back to the canonical key.
_MAX_ALIASES = 8
#: Containers a copy plan may rebuild per hit; bigger values are decoded instead.
_MAX_CONTAINERS = 32


class L1Item:
    """One entry: ``value`` itself when immutable, else ``load`` makes an independent copy."""

    __slots__ = ("aliases", "digest", "expires", "load", "size", "value")

    def __init__(self, expires: float, size: int, value: Any,
                 load: Callable[[], Any] | None) -> None:
        self.expires = expires  # time.time() deadline; 0.0 means never
        self.size = size
        self.value = value
        self.load = load
        self.digest = b""
        self.aliases: list[tuple[Any, ...]] = []  # its keys in L1.fast


class L1:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("l1_max_entries and l1_max_bytes must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.items: OrderedDict[bytes, L1Item] = OrderedDict()
        #: positional argument tuple -> (their types, item); read without the lock by the shells
        self.fast: dict[tuple[Any, ...], tuple[tuple[type, ...], L1Item]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def get(self, digest: bytes) -> L1Item | None:
        with self._lock:
            item = self.items.get(digest)
            if item is None:
                return None
            if item.expires and item.expires <= time.time():
                self._drop(digest)
                return None
            self.items.move_to_end(digest)
            return item

    def put(self, digest: bytes, item: L1Item) -> None:
        if item.size > self.max_bytes:
            return
        item.digest = digest
        with self._lock:
            if digest in self.items:
                self._drop(digest)
            self.items[digest] = item
            self._bytes += item.size
            while len(self.items) > self.max_entries or self._bytes > self.max_bytes:
                # one C call: the fast path moves entries to the end without the lock, which
                # would break an iterator taken here
                self._forget(self.items.popitem(last=False)[1])

    def alias(self, args: tuple[Any, ...], digest: bytes) -> None:
        """Let ``fast`` find the entry of ``digest`` by these positional arguments, when they
        are all plain scalars. Zero floats are left out: ``-0.0 == 0.0`` but they are different
        arguments (and keys)."""
        for arg in args:
            if type(arg) not in _KEYABLE or (type(arg) is float and arg == 0.0):
                return
        types = tuple(map(type, args))
        with self._lock:
            item = self.items.get(digest)
            if item is not None and args not in self.fast and len(item.aliases) < _MAX_ALIASES:
                self.fast[args] = (types, item)
                item.aliases.append(args)

    def pop(self, digest: bytes) -> None:
        with self._lock:
            if digest in self.items:
                self._drop(digest)

    def clear(self) -> None:
        with self._lock:
            self.items.clear()
            self.fast.clear()
            self._bytes = 0

    def _drop(self, digest: bytes) -> None:
        self._forget(self.items.pop(digest))

    def _forget(self, item: L1Item) -> None:
        self._bytes -= item.size
        for args in item.aliases:
            if self.fast.get(args, (None, None))[1] is item:
                del self.fast[args]


def frozen_size(value: Any) -> int | None:
    """The deep size of a value that can never change (scalars, tuples and frozensets of
    them), or None if ``value`` is anything else."""
    cls = type(value)
    if cls in _SCALARS:
        return sys.getsizeof(value)
    if cls is tuple or cls is frozenset:
        total = sys.getsizeof(value)
        for item in value:
            size = frozen_size(item)
            if size is None:
                return None
            total += size
        return total
    return None


class _NotPlain(Exception):
    pass


def copier(value: Any) -> Callable[[], Any] | None:
    """A function returning a fresh copy of ``value`` on every call, or None unless ``value`` is
    built of plain dicts, lists and sets (at most _MAX_CONTAINERS of them) around immutable
    values. The copy shares only immutable parts with other copies, so mutating it (at any
    depth) never changes what the next call returns; it is several times cheaper than decoding.
    ``value`` itself is copied first, so later changes to it do not leak in either."""
    budget = [_MAX_CONTAINERS]
    try:
        return _plan(value, budget)
    except _NotPlain:
        return None


def _plan(value: Any, budget: list[int]) -> Callable[[], Any]:
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotPlain
    cls = type(value)
    if cls is dict:
        own: Any = {}
        subs: list[tuple[Any, Callable[[], Any]]] = []
        for k, v in value.items():
            if frozen_size(k) is None:
                raise _NotPlain
            own[k] = _part(k, v, subs, budget)
    elif cls is list:
        own, subs = [], []
        for i, v in enumerate(value):
            own.append(_part(i, v, subs, budget))
    elif cls is set:
        if any(frozen_size(v) is None for v in value):
            raise _NotPlain
        return set(value).copy
    else:
        raise _NotPlain
    shallow = own.copy
    if not subs:
        return shallow  # type: ignore[no-any-return]
    if len(subs) == 1:  # the common case, without the loop
        ((where, sub),) = subs

        def copy_one() -> Any:
            fresh = shallow()
            fresh[where] = sub()
            return fresh

        return copy_one

    def copy() -> Any:
        fresh = shallow()
        for where, sub in subs:
            fresh[where] = sub()
        return fresh

    return copy


def _part(where: Any, value: Any, subs: list[tuple[Any, Callable[[], Any]]],
          budget: list[int]) -> Any:
    """``value`` itself if immutable; else a placeholder, with its plan recorded in ``subs``."""
    if frozen_size(value) is not None:
        return value
    subs.append((where, _plan(value, budget)))
    return None
