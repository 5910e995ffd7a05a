"""MessagePack for plain Python values, with the types JSON loses kept as themselves."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import uuid
import zoneinfo
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from arrowstash.entry.format import Encoded
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


Extension = Callable[[Any], "msgpack.ExtType | None"]
ExtensionDecoder = Callable[[int, bytes], Any]
_OPTIONS = {"use_bin_type": True, "strict_types": True}


def packer(extension: Extension | None = None) -> Callable[[Any], bytes]:
    """A pack function for the standard types, plus whatever ``extension`` encodes (it returns
    an ExtType, or None for values it does not know). Each call packs with a fresh packer, so
    one function may serve many threads."""

    def default(obj: Any) -> msgpack.ExtType:
        ext = _standard_ext(obj, pack)
        if ext is None and extension is not None:
            ext = extension(obj)
        if ext is None:
            cls = type(obj)
            raise SerializationError(
                f"type {cls.__module__}.{cls.__qualname__} is not supported by the standard "
                "serializer (plain values only; frames and arrays have serializers of their own)"
            )
        return ext

    def pack(value: Any) -> bytes:
        packed: bytes = msgpack.packb(value, default=default, **_OPTIONS)
        return packed

    return pack


def unpacker(extension: ExtensionDecoder | None = None) -> Callable[[Any], Any]:
    """The unpack function matching :func:`packer` with the same kind of extension."""

    def hook(code: int, data: bytes) -> Any:
        if code in _DECODERS:
            try:
                return _DECODERS[code](data, unpack)
            except (struct.error, ArithmeticError, IndexError) as exc:  # a damaged payload
                raise ValueError(f"MessagePack extension type {code}: {exc}") from exc
        if extension is not None:
            return extension(code, data)
        raise SerializationError(f"unknown MessagePack extension type {code}")

    def unpack(data: Any) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=hook)

    return unpack


def pack_checked(pack: Callable[[Any], bytes], value: Any) -> bytes:
    """``pack(value)``, with a failure reported as a SerializationError naming where it is."""
    try:
        return pack(value)
    except (TypeError, ValueError, OverflowError) as exc:  # SerializationError included
        path = _find_unsupported(value, "value") or "value"
        cause = None if isinstance(exc, SerializationError) else exc
        raise SerializationError(f"{path}: {exc}") from cause


def unpack_checked(unpack: Callable[[Any], Any], data: Any) -> Any:
    try:
        return unpack(data)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptEntryError(f"undecodable MessagePack payload: {exc}") from exc


class StandardSerializer:
    """Plain values: None, bool, int, float, str, bytes, containers, dates, Decimal, UUID and
    NumPy scalars, each decoded as the type it was.

    Anything else is refused with a :class:`SerializationError` naming its path inside the value,
    so a frame or an array never ends up pickled by accident.
    """

    name = "standard"
    executes_code = False
    mutable_results = False  # decoded containers are new objects; nothing views the entry

    def for_backend(self, remote: bool) -> StandardSerializer:
        return self

    def encode(self, value: Any) -> Encoded:
        return Encoded(self.name, None, [self.pack(value)])

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any:
        try:
            return _unpack(sections[0])
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptEntryError(f"undecodable MessagePack payload: {exc}") from exc

    def pack(self, value: Any) -> bytes:
        return pack_checked(_pack, value)

    def unpack(self, data: Any) -> Any:
        return unpack_checked(_unpack, data)


def _standard_ext(obj: Any, pack: Callable[[Any], bytes]) -> msgpack.ExtType | None:
    cls = type(obj)
    if cls is int:  # beyond 64 bits
        return msgpack.ExtType(_BIGINT, str(obj).encode())
    if cls is tuple:
        return msgpack.ExtType(_TUPLE, pack(list(obj)))
    if cls is set or cls is frozenset:
        return msgpack.ExtType(_SET if cls is set else _FROZENSET, pack(list(obj)))
    if cls is dt.datetime:
        state = [obj.year, obj.month, obj.day, obj.hour, obj.minute, obj.second,
                 obj.microsecond, obj.fold, _tz_state(obj.tzinfo, "datetime")]
        return msgpack.ExtType(_DATETIME, pack(state))
    if cls is dt.date:
        return msgpack.ExtType(_DATE, struct.pack("<i", obj.toordinal()))
    if cls is dt.time:
        state = [obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold,
                 _tz_state(obj.tzinfo, "time")]
        return msgpack.ExtType(_TIME, pack(state))
    if cls is dt.timedelta:
        return msgpack.ExtType(_TIMEDELTA, _TD.pack(obj.days, obj.seconds, obj.microseconds))
    if cls is decimal.Decimal:
        return msgpack.ExtType(_DECIMAL, str(obj).encode())
    if cls is uuid.UUID:
        return msgpack.ExtType(_UUID, obj.bytes)
    if cls is complex:
        return msgpack.ExtType(_COMPLEX, _COMPLEX_S.pack(obj.real, obj.imag))
    if _numpy_scalar(obj):
        return msgpack.ExtType(_NUMPY, pack([obj.dtype.str, obj.tobytes()]))
    return None


def _numpy_scalar(obj: Any) -> bool:
    cls = type(obj)
    return (cls.__module__ == "numpy" and cls.__name__ != "ndarray"
            and getattr(obj, "ndim", None) == 0 and not obj.dtype.hasobject)


def _datetime(data: bytes, unpack: Callable[[Any], Any]) -> dt.datetime:
    year, month, day, hour, minute, second, micro, fold, tz = unpack(data)
    return dt.datetime(year, month, day, hour, minute, second, micro,
                       tzinfo=_tz_from_state(tz), fold=fold)


def _time(data: bytes, unpack: Callable[[Any], Any]) -> dt.time:
    hour, minute, second, micro, fold, tz = unpack(data)
    return dt.time(hour, minute, second, micro, tzinfo=_tz_from_state(tz), fold=fold)


def _timedelta(data: bytes, unpack: Callable[[Any], Any]) -> dt.timedelta:
    days, seconds, micros = _TD.unpack(data)
    return dt.timedelta(days=days, seconds=seconds, microseconds=micros)


def _numpy_value(data: bytes, unpack: Callable[[Any], Any]) -> Any:
    import numpy as np

    dtype, raw = unpack(data)
    return np.frombuffer(raw, dtype=np.dtype(dtype))[0]


_DECODERS: dict[int, Callable[[bytes, Callable[[Any], Any]], Any]] = {
    _BIGINT: lambda data, unpack: int(data),
    _TUPLE: lambda data, unpack: tuple(unpack(data)),
    _SET: lambda data, unpack: set(unpack(data)),
    _FROZENSET: lambda data, unpack: frozenset(unpack(data)),
    _DATETIME: _datetime,
    _DATE: lambda data, unpack: dt.date.fromordinal(struct.unpack("<i", data)[0]),
    _TIME: _time,
    _TIMEDELTA: _timedelta,
    _DECIMAL: lambda data, unpack: decimal.Decimal(data.decode()),
    _UUID: lambda data, unpack: uuid.UUID(bytes=bytes(data)),
    _COMPLEX: lambda data, unpack: complex(*_COMPLEX_S.unpack(data)),
    _NUMPY: _numpy_value,
}
_pack = packer()
_unpack = unpacker()


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
