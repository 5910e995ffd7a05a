"""The standard serializer: every supported value comes back equal and of exactly its type."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
import uuid
import zoneinfo
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstash import CorruptEntryError, SerializationError, StandardSerializer
from arrowstash.entry.format import Key, entry_bytes, parse_entry

SER = StandardSerializer()


def round_trip(value: Any) -> Any:
    encoded = SER.encode(value)
    assert encoded.serializer == "standard"
    # Through a real entry, so the sections the decoder sees are views into an entry buffer.
    entry = parse_entry(entry_bytes(Key("n", "f", bytes(16)), encoded, created=0.0, expires=None))
    return SER.decode(entry.meta, entry.sections)


def _float(x: float) -> Any:
    return "nan" if math.isnan(x) else struct.pack("<d", x)  # keeps -0.0 apart from 0.0


def _tz(tz: dt.tzinfo | None) -> Any:
    if tz is None:
        return None
    if isinstance(tz, zoneinfo.ZoneInfo):
        return ("zoneinfo", tz.key)
    return (type(tz), tz.utcoffset(None), tz.tzname(None))


def canon(value: Any) -> Any:
    """A hashable description of ``value`` that tells apart everything a round trip must keep:
    exact types at every level, float bits, Decimal exponents, time zones, fold, dict order."""
    cls = type(value)
    if cls is float:
        return (cls, _float(value))
    if cls is complex:
        return (cls, _float(value.real), _float(value.imag))
    if cls is list or cls is tuple:
        return (cls, tuple(canon(v) for v in value))
    if cls is set or cls is frozenset:
        return (cls, frozenset(canon(v) for v in value))
    if cls is dict:
        return (cls, tuple((canon(k), canon(v)) for k, v in value.items()))
    if cls is decimal.Decimal:
        return (cls, str(value))  # '1.0' and '1.00' differ; NaN compares unequal to itself
    if cls is dt.datetime or cls is dt.time:
        return (cls, value.isoformat(), value.fold, _tz(value.tzinfo))
    if cls.__module__ == "numpy":
        return (cls, value.dtype.str, value.tobytes())
    assert cls in (type(None), bool, int, str, bytes, dt.date, dt.timedelta, uuid.UUID), cls
    return (cls, value)


def assert_same(got: Any, want: Any) -> None:
    assert canon(got) == canon(want), f"{got!r} != {want!r}"


# -- strategies ---------------------------------------------------------------------------------

_offsets = st.timedeltas(
    min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59)
)
_fixed_zones = st.one_of(
    st.just(dt.timezone.utc),
    st.builds(dt.timezone, _offsets),
    st.builds(dt.timezone, _offsets, st.text(min_size=1, max_size=8)),
)
_zones = st.none() | _fixed_zones | st.timezones()

_big_ints = st.sampled_from(
    [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**40, -(10**40), 2**1000]
)
_ints = st.integers() | st.integers(min_value=-(2**300), max_value=2**300) | _big_ints

_numpy_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.floats(width=32).map(np.float32),
    st.booleans().map(np.bool_),
    st.builds(
        np.datetime64,
        st.integers(-(2**40), 2**40).map(int),
        st.sampled_from(["D", "s", "ms", "us", "ns"]),
    ),
)

_hashable_leaves = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    st.text(max_size=20),
    st.binary(max_size=20),
    st.dates(),
    st.timedeltas(),
    st.uuids(),
    st.datetimes(timezones=_zones),
)
_leaves = st.one_of(
    _hashable_leaves,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308]),
    st.times(timezones=_zones),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    _numpy_scalars,
)
_hashables = st.recursive(
    _hashable_leaves,
    lambda inner: st.lists(inner, max_size=3).map(tuple)
    | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
_keys = st.text(max_size=10) | _ints | st.lists(_hashable_leaves, max_size=3).map(tuple)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(_keys, inner, max_size=5),
        st.sets(_hashables, max_size=5),
        st.frozensets(_hashables, max_size=5),
    )


values = st.recursive(_leaves, _containers, max_leaves=25)


# -- round trips --------------------------------------------------------------------------------


@given(values)
@settings(max_examples=400, deadline=None)
def test_round_trip_keeps_value_and_exact_types(value: Any) -> None:
    assert_same(round_trip(value), value)


@given(_leaves)
@settings(max_examples=300, deadline=None)
def test_round_trip_of_every_leaf_type(value: Any) -> None:
    assert_same(round_trip(value), value)


@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, -1, 2**64, -(2**64), 2**63, -(2**63) - 1, 12345678901234567890123,
        0.0, -0.0, math.inf, -math.inf, math.nan, 1.5, "", "héllo ☃", b"", b"\x00\xff",
        [], (), {}, set(), frozenset(), [()], ((),), {(): ()}, [[1, [2, (3, {4})]]],
        {"a": 1, 2: "b", (3, "c"): [4.5]}, {1: "x", False: "y"}, {frozenset({1}): {2}},
        dt.datetime(2024, 3, 31, 2, 30), dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))),
        dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2), "CEST")),
        dt.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
        dt.datetime(1, 1, 1), dt.datetime.max, dt.date(1, 1, 1), dt.date.max,
        dt.time(23, 59, 59, 999999), dt.time(1, tzinfo=zoneinfo.ZoneInfo("Asia/Kolkata")),
        dt.time(1, fold=1), dt.timedelta(days=-1, microseconds=1), dt.timedelta.max,
        decimal.Decimal("1.10"), decimal.Decimal("-0"), decimal.Decimal("NaN"),
        decimal.Decimal("sNaN"), decimal.Decimal("-Infinity"), decimal.Decimal("1E+999999"),
        uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), complex(-0.0, math.nan), 1j,
        np.int64(-(2**63)), np.float32(-0.0), np.float32("nan"), np.bool_(False),
        np.datetime64("2020-01-01"), np.datetime64("NaT"), np.datetime64(1, "ns"),
    ],
    ids=repr,
)
def test_round_trip_of_edge_values(value: Any) -> None:
    assert_same(round_trip(value), value)


def test_utc_comes_back_as_the_utc_singleton() -> None:
    value = round_trip(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))
    assert value.tzinfo is dt.timezone.utc


def test_zoneinfo_comes_back_as_the_same_zone() -> None:
    zone = zoneinfo.ZoneInfo("America/New_York")
    value = round_trip(dt.datetime(2024, 7, 1, 12, tzinfo=zone))
    assert value.tzinfo is zone
    assert value.utcoffset() == dt.timedelta(hours=-4)


def test_decoding_copies_out_of_the_buffer() -> None:
    """A decoded value must not change when the buffer it was read from is reused."""
    encoded = SER.encode({"k": b"payload", "s": "text"})
    buffer = bytearray(encoded.sections[0])
    value = SER.decode(None, [memoryview(buffer)])
    buffer[:] = bytes(len(buffer))
    assert value == {"k": b"payload", "s": "text"}


def test_encoder_is_reusable_after_a_refusal() -> None:
    with pytest.raises(SerializationError):
        SER.encode([1, object()])
    assert round_trip([1, 2]) == [1, 2]


# -- refusals -----------------------------------------------------------------------------------


class _MyInt(int):
    pass


class _MyStr(str):
    pass


class _CustomZone(dt.tzinfo):
    def utcoffset(self, when: Any) -> dt.timedelta:
        return dt.timedelta(hours=1)

    def dst(self, when: Any) -> dt.timedelta:
        return dt.timedelta(0)

    def tzname(self, when: Any) -> str:
        return "CUSTOM"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"rows": [1, 2, 3, object()]}, "value['rows'][3]"),
        (object(), "value"),
        ([1, (2, {"k": [None, object()]})], "value[1][1]['k'][1]"),
        ((1, 2, range(3)), "value[2]"),
        ({"a": {"b": _MyInt(3)}}, "value['a']['b']"),
        ([_MyStr("s")], "value[0]"),
        ({"when": dt.datetime(2024, 1, 1, tzinfo=_CustomZone())}, "value['when']"),
        ([dt.time(1, tzinfo=_CustomZone())], "value[0]"),
        ({"arr": np.arange(3)}, "value['arr']"),
        ([np.array(1, dtype=object)], "value[0]"),
        ({1: {2: lambda: None}}, "value[1][2]"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_refusal_names_the_path(value: Any, path: str) -> None:
    with pytest.raises(SerializationError) as excinfo:
        SER.encode(value)
    message = str(excinfo.value)
    assert message.startswith(f"{path}:"), message
    assert isinstance(excinfo.value, TypeError)


@pytest.mark.parametrize(
    "value", [bytearray(b"ab"), memoryview(b"ab")], ids=["bytearray", "memoryview"]
)
def test_bytes_like_values_come_back_as_bytes(value: Any) -> None:
    """The one documented normalisation: MessagePack packs every bytes-like object as binary,
    so bytearray and memoryview come back as bytes with the same content (docs/serializers.md)."""
    encoded = SER.encode({"b": value})
    decoded = SER.decode(encoded.meta, [memoryview(s) for s in encoded.sections])
    assert type(decoded["b"]) is bytes
    assert decoded["b"] == bytes(value)


def test_refusal_in_a_set_or_a_dict_key_names_where() -> None:
    class Hashable:
        def __repr__(self) -> str:
            return "<Hashable>"

    with pytest.raises(SerializationError, match=r"^value\['s'\] item <Hashable>"):
        SER.encode({"s": {Hashable()}})
    with pytest.raises(SerializationError, match=r"^value\[0\] key <Hashable>"):
        SER.encode([{Hashable(): 1}])


def test_refusal_message_says_what_is_unsupported() -> None:
    with pytest.raises(SerializationError, match="not supported") as excinfo:
        SER.encode({"rows": [1, 2, 3, object()]})
    assert "builtins.object" in str(excinfo.value)
    with pytest.raises(SerializationError, match="time zone"):
        SER.encode(dt.datetime(2024, 1, 1, tzinfo=_CustomZone()))


# -- undecodable bytes --------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01", b"\xd9\x05ab", b"\x01\x02"])
def test_undecodable_payload_is_a_corrupt_entry(data: bytes) -> None:
    with pytest.raises(CorruptEntryError):
        SER.decode(None, [memoryview(data)])


def test_unknown_extension_type_is_refused() -> None:
    data = msgpack.packb(msgpack.ExtType(99, b"?"))
    with pytest.raises((CorruptEntryError, SerializationError), match="99"):
        SER.decode(None, [memoryview(data)])
