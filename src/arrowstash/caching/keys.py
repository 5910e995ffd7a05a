"""Cache keys: a canonical, process-independent encoding of a call's bound arguments, hashed.

Every value is written as a type tag plus its content, so ``1``, ``1.0`` and ``True`` differ and
the same call gives the same key on every machine and Python run. Arrays and frames are hashed
by their buffers, column by column (so an equal frame with another block layout or chunking gets
the same key). Other objects (instances of the user's classes) are hashed by content: their
pickle protocol 5 stream, with out-of-band buffers hashed in place. The prefix of every key holds
a fingerprint of the function's code (see ``caching.code``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import inspect
import math
import pathlib
import pickle
import struct
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import xxhash

_Q = struct.Struct("<q")
_D = struct.Struct("<d")


class _Hasher:
    """Feeds tagged, length-prefixed parts to xxh3-128."""

    __slots__ = ("h", "where")

    def __init__(self, prefix: bytes) -> None:
        self.h = xxhash.xxh3_128(prefix)
        self.where = ""

    def tag(self, tag: bytes, data: bytes | memoryview = b"") -> None:
        self.h.update(tag + _Q.pack(len(data)))
        self.h.update(data)

    def value(self, obj: Any) -> None:
        cls = type(obj)
        if obj is None:
            self.tag(b"N")
        elif cls is bool:
            self.tag(b"T" if obj else b"F")
        elif cls is int:
            self.tag(b"i", str(obj).encode())
        elif cls is float:
            self.tag(b"f", b"nan" if math.isnan(obj) else _D.pack(obj))
        elif cls is str:
            self.tag(b"s", obj.encode("utf-8", "surrogatepass"))
        elif cls is bytes or cls is bytearray:
            self.tag(b"b" if cls is bytes else b"B", obj)
        elif cls is tuple or cls is list:
            self.tag(b"(" if cls is tuple else b"[", _Q.pack(len(obj)))
            for item in obj:
                self.value(item)
        elif cls is dict:
            self._unordered(b"{", (self._sub((k, v)) for k, v in obj.items()))
        elif cls is set or cls is frozenset:
            self._unordered(b"<" if cls is set else b">", (self._sub(item) for item in obj))
        elif cls is dt.datetime or cls is dt.time:
            self.tag(b"t" if cls is dt.time else b"D", f"{obj.isoformat()}|{obj.tzinfo}".encode())
        elif cls is dt.date:
            self.tag(b"d", obj.isoformat().encode())
        elif cls is dt.timedelta:
            self.tag(b"z", struct.pack("<qii", obj.days, obj.seconds, obj.microseconds))
        elif cls is decimal.Decimal:
            self.tag(b"m", str(obj).encode())
        elif cls is uuid.UUID:
            self.tag(b"u", obj.bytes)
        elif cls is complex:
            self.tag(b"c", _D.pack(obj.real) + _D.pack(obj.imag))
        elif isinstance(obj, enum.Enum):
            self.tag(b"e", f"{cls.__module__}.{cls.__qualname__}".encode())
            self.value(obj.value)
        elif isinstance(obj, pathlib.PurePath):
            self.tag(b"p", f"{cls.__name__}:{obj}".encode())
        elif isinstance(obj, type):
            self.tag(b"y", f"{obj.__module__}.{obj.__qualname__}".encode())
        elif dataclasses.is_dataclass(obj):
            self.tag(b"@", f"{cls.__module__}.{cls.__qualname__}".encode())
            for f in dataclasses.fields(obj):
                self.tag(b"s", f.name.encode())
                self.value(getattr(obj, f.name))
        elif hasattr(obj, "__cache_key__"):
            self.tag(b"k", f"{cls.__module__}.{cls.__qualname__}".encode())
            self.value(obj.__cache_key__())
        else:
            from arrowstash.caching import columns

            if not columns.hash_into(self, obj):
                self._pickled(obj)

    def _pickled(self, obj: Any) -> None:
        """Any other object by content: its pickle stream, and its out-of-band buffers (large
        arrays inside it) hashed where they lie."""
        buffers = xxhash.xxh3_128()

        def hash_buffer(buffer: pickle.PickleBuffer) -> None:
            raw = buffer.raw()
            buffers.update(raw.nbytes.to_bytes(8, "little"))
            buffers.update(raw)

        try:
            stream = pickle.dumps(obj, protocol=5, buffer_callback=hash_buffer)
        except (pickle.PicklingError, TypeError, AttributeError, ValueError) as exc:
            cls = type(obj)
            hint = "" if self.where in ("parameter 'self'", "parameter 'cls'") else \
                ", or leave the parameter out of the key with ignore= if it cannot change " \
                "the result"
            raise TypeError(
                f"cannot build a cache key from {self.where}: a value of type "
                f"{cls.__module__}.{cls.__qualname__} has no content to hash (it cannot be "
                f"pickled: {exc}); pass key= to the decorator, give the type a "
                f"__cache_key__() method{hint}"
            ) from None
        self.tag(b"o", stream)
        self.h.update(buffers.digest())

    def _sub(self, obj: Any) -> bytes:
        sub = _Hasher(b"")
        sub.where = self.where
        sub.value(obj)
        return sub.h.digest()

    def _unordered(self, tag: bytes, digests: Iterable[bytes]) -> None:
        parts = sorted(digests)
        self.tag(tag, _Q.pack(len(parts)))
        for part in parts:
            self.h.update(part)


def digest_of(value: Any) -> bytes:
    """The digest of one value by the key rules (TypeError when it has none)."""
    hasher = _Hasher(b"")
    hasher.where = "a value"
    hasher.value(value)
    return hasher.h.digest()


_FAST = frozenset({int, str, float, bool, bytes, type(None)})


def _memoisable(value: Any) -> bool:
    """Plain scalars whose equality is identity of content: ``-0.0 == 0.0`` (and they hash alike)
    but they are different arguments, so zero floats are never memoised."""
    return type(value) in _FAST and not (type(value) is float and value == 0.0)


class KeyMaker:
    """Turns ``(args, kwargs)`` of one function into a 16-byte digest.

    Calls whose arguments are all plain scalars are memoised by their argument tuple, which is
    what makes an L1 hit cost about a microsecond.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        prefix: str,
        ignore: Iterable[str] = (),
        key: Callable[..., Any] | None = None,
        memo_size: int = 4096,
        code: Any = None,  # a caching.code.CodeTracker (which imports this module)
        on_code_change: Callable[[], None] | None = None,
    ) -> None:
        self._signature = inspect.signature(func)
        self._ignore = frozenset(ignore)
        unknown = self._ignore - self._signature.parameters.keys()
        if unknown:
            raise ValueError(
                f"ignore= names {sorted(unknown)} that are not parameters of "
                f"{func.__qualname__}{self._signature}"
            )
        self._base = self._prefix = prefix.encode()
        self._code = code
        self._on_code_change = on_code_change
        self._key = key
        self._memo: dict[Any, bytes] = {}
        self._memo_size = memo_size

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        code = self._code
        if code is not None and code.changed():
            self._code_moved(code)
        if kwargs:
            items = tuple(sorted(kwargs.items()))
            memo_key: Any = (args, tuple(map(type, args)), items, tuple(type(v) for _, v in items))
        elif len(args) == 1:  # the common case, without building a tuple of types
            memo_key = (args, type(args[0]))
        else:
            memo_key = (args, tuple(map(type, args)))
        try:
            digest = self._memo.get(memo_key)
        except TypeError:  # unhashable arguments
            return self._digest(args, kwargs)
        if digest is not None:
            # Only calls whose arguments were all of _FAST types were memoised, and the types
            # are part of the memo key, so this call's arguments are plain scalars too.
            return digest
        digest = self._digest(args, kwargs)
        if all(map(_memoisable, args)) and all(map(_memoisable, kwargs.values())):
            if len(self._memo) >= self._memo_size:
                self._memo.pop(next(iter(self._memo)))
            self._memo[memo_key] = digest
        return digest

    def _code_moved(self, code: Any) -> None:
        """A global the code fingerprint read was rebound: recompute it; a new one is a new
        prefix for every key (old entries are never served again)."""
        old = code.fingerprint
        new = code.update()
        if new == old:
            return
        self._prefix = self._base + new + b"\0"
        self._memo.clear()
        if old is not None and self._on_code_change is not None:
            self._on_code_change()

    def _digest(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        hasher = _Hasher(self._prefix)
        if self._key is not None:
            hasher.where = "the value returned by key="
            hasher.value(self._key(*args, **kwargs))
            return hasher.h.digest()
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            if name in self._ignore:
                continue
            hasher.where = f"parameter {name!r}"
            hasher.tag(b"a", name.encode())
            param = self._signature.parameters[name]
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                hasher.value(dict(value))
            else:
                hasher.value(value)
        return hasher.h.digest()
