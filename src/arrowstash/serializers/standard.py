"""MessagePack for plain Python values, with the types JSON loses kept as themselves."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import uuid
import zoneinfo
from collections.abc import Sequence
from typing import Any

import msgpack

from arrowstash.entry import Encoded
from arrowstash.errors import CorruptEntryError, SerializationError

# Extension type codes; part of the stored format, never renumber.
_BIGINT, _TUPLE, _SET, _FROZENSET, _DATETIME, _DATE, _TIME, _TIMEDELTA = range(1, 9)
_DECIMAL, _UUID, _NUMPY, _COMPLEX = range(9, 13)

_TD = struct.Struct("<qii")  # days, seconds, microseconds
_COMPLEX_S = struct.Struct("<dd")


def _tz_state(tz: dt.tzinfo | None, where: str) -> Any:
    if tz is None:
        return None
    if isinstance(tz, zoneinfo.ZoneInfo):
        return tz.key
    if isinstance(tz, dt.timezone):
        offset = tz.utcoffset(None)
        name = tz.tzname(None)
        return [offset.days, offset.seconds, offset.microseconds, name]
    raise SerializationError(
        f"{where}: time zone of type {type(tz).__qualname__} is not supported; "
        "use zoneinfo.ZoneInfo or datetime.timezone"
    )


def _tz_from_state(state: Any) -> dt.tzinfo | None:
    if state is None:
        return None
    if isinstance(state, str):
        return zoneinfo.ZoneInfo(state)
    days, seconds, micros, name = state
    offset = dt.timedelta(days=days, seconds=seconds, microseconds=micros)
    if offset == dt.timedelta(0) and name == "UTC":
        return dt.timezone.utc
    return dt.timezone(offset, name)


class StandardSerializer:
    """Plain values: None, bool, int, float, str, bytes, containers, dates, Decimal, UUID and
    NumPy scalars, each decoded as the type it was.

    Anything else is refused with a :class:`SerializationError` naming its path inside the value,
    so a frame or an array never ends up pickled by accident.
    """

    name = "standard"

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True, strict_types=True, default=self._default)

    def encode(self, value: Any) -> Encoded:
        return Encoded(self.name, None, [self.pack(value)])

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any:
        return self.unpack(sections[0])

    def pack(self, value: Any) -> bytes:
        try:
            return bytes(self._packer.pack(value))
        except (TypeError, ValueError, OverflowError) as exc:  # SerializationError included
            self._packer.reset()
            path = _find_unsupported(value, "value") or "value"
            cause = None if isinstance(exc, SerializationError) else exc
            raise SerializationError(f"{path}: {exc}") from cause

    def unpack(self, data: Any) -> Any:
        try:
            return _unpack(data)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptEntryError(f"undecodable MessagePack payload: {exc}") from exc

    def _default(self, obj: Any) -> msgpack.ExtType:
        cls = type(obj)
        if cls is int:  # beyond 64 bits
            return msgpack.ExtType(_BIGINT, str(obj).encode())
        if cls is tuple:
            return msgpack.ExtType(_TUPLE, self._sub(list(obj)))
        if cls is set or cls is frozenset:
            code = _SET if cls is set else _FROZENSET
            return msgpack.ExtType(code, self._sub(list(obj)))
        if cls is dt.datetime:
            state = [obj.year, obj.month, obj.day, obj.hour, obj.minute, obj.second,
                     obj.microsecond, obj.fold, _tz_state(obj.tzinfo, "datetime")]
            return msgpack.ExtType(_DATETIME, self._sub(state))
        if cls is dt.date:
            return msgpack.ExtType(_DATE, struct.pack("<i", obj.toordinal()))
        if cls is dt.time:
            state = [obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold,
                     _tz_state(obj.tzinfo, "time")]
            return msgpack.ExtType(_TIME, self._sub(state))
        if cls is dt.timedelta:
            return msgpack.ExtType(_TIMEDELTA, _TD.pack(obj.days, obj.seconds, obj.microseconds))
        if cls is decimal.Decimal:
            return msgpack.ExtType(_DECIMAL, str(obj).encode())
        if cls is uuid.UUID:
            return msgpack.ExtType(_UUID, obj.bytes)
        if cls is complex:
            return msgpack.ExtType(_COMPLEX, _COMPLEX_S.pack(obj.real, obj.imag))
        if cls.__module__ == "numpy" and hasattr(obj, "dtype") and getattr(obj, "ndim", 1) == 0:
            if obj.dtype.hasobject:
                raise SerializationError("NumPy object scalars are not supported")
            return msgpack.ExtType(_NUMPY, self._sub([obj.dtype.str, obj.tobytes()]))
        raise SerializationError(
            f"type {cls.__module__}.{cls.__qualname__} is not supported by the standard "
            "serializer (use serializer='auto' or a serializer made for it)"
        )

    def _sub(self, value: Any) -> bytes:
        # A fresh packer: the outer one is in the middle of a value.
        packed: bytes = msgpack.packb(
            value, use_bin_type=True, strict_types=True, default=self._default
        )
        return packed


def _unpack(data: Any) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _BIGINT:
        return int(data)
    if code == _TUPLE:
        return tuple(_unpack(data))
    if code == _SET:
        return set(_unpack(data))
    if code == _FROZENSET:
        return frozenset(_unpack(data))
    if code == _DATETIME:
        year, month, day, hour, minute, second, micro, fold, tz = _unpack(data)
        return dt.datetime(year, month, day, hour, minute, second, micro,
                           tzinfo=_tz_from_state(tz), fold=fold)
    if code == _DATE:
        return dt.date.fromordinal(struct.unpack("<i", data)[0])
    if code == _TIME:
        hour, minute, second, micro, fold, tz = _unpack(data)
        return dt.time(hour, minute, second, micro, tzinfo=_tz_from_state(tz), fold=fold)
    if code == _TIMEDELTA:
        days, seconds, micros = _TD.unpack(data)
        return dt.timedelta(days=days, seconds=seconds, microseconds=micros)
    if code == _DECIMAL:
        return decimal.Decimal(data.decode())
    if code == _UUID:
        return uuid.UUID(bytes=data)
    if code == _COMPLEX:
        return complex(*_COMPLEX_S.unpack(data))
    if code == _NUMPY:
        import numpy as np

        dtype, raw = _unpack(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
    raise SerializationError(f"unknown MessagePack extension type {code}")


_PLAIN = (type(None), bool, int, float, str, bytes, complex, dt.date, dt.timedelta,
          decimal.Decimal, uuid.UUID)


def _find_unsupported(value: Any, path: str) -> str | None:
    """Return the path of the first part of ``value`` the serializer refuses (for the message)."""
    cls = type(value)
    if cls is list or cls is tuple:
        parts: Any = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif cls is set or cls is frozenset:
        parts = ((f"{path} item {v!r}", v) for v in value)
    elif cls is dict:
        parts = (
            part
            for k, v in value.items()
            for part in ((f"{path} key {k!r}", k), (f"{path}[{k!r}]", v))
        )
    else:
        return None if _supported_leaf(value) else path
    for label, part in parts:
        found = _find_unsupported(part, label)
        if found is not None:
            return found
    return None


def _supported_leaf(value: Any) -> bool:
    cls = type(value)
    if cls is dt.datetime or cls is dt.time:
        tz = value.tzinfo
        return tz is None or isinstance(tz, (zoneinfo.ZoneInfo, dt.timezone))
    if cls in _PLAIN:
        return True
    return (
        cls.__module__ == "numpy"
        and getattr(value, "ndim", None) == 0
        and not value.dtype.hasobject
    )
