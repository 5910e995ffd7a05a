"""Hypothesis strategies for Avro tests: random schemas (every type and logical type) and values
that fastavro's writer accepts for them."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
from hypothesis import assume
from hypothesis import strategies as st

from arrowstash.avro.schema import (
    Array,
    AvroType,
    Enum,
    Fixed,
    Map,
    Primitive,
    Record,
    Union,
    parse_schema,
)

PRIMITIVE_NAMES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string"]
LOGICAL = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
    {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
    {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 5},
    {"type": "int", "logicalType": "no-such-logical-type"},  # read as its underlying type
    {"type": "long", "logicalType": "date"},  # invalid on long: read as long
]


class _Names:
    def __init__(self) -> None:
        self.n = 0

    def new(self) -> str:
        self.n += 1
        return f"T{self.n}"


def _leaf(names: _Names) -> st.SearchStrategy[Any]:
    def fixed(kind: str) -> Callable[[Any], dict[str, Any]]:
        def build(_: Any) -> dict[str, Any]:
            name = names.new()
            if kind == "uuid":
                return {"type": "fixed", "name": name, "size": 16, "logicalType": "uuid"}
            if kind == "decimal":
                return {"type": "fixed", "name": name, "size": 8, "logicalType": "decimal",
                        "precision": 18, "scale": 3}
            return {"type": "fixed", "name": name, "size": 3}

        return build

    return st.one_of(
        st.sampled_from(PRIMITIVE_NAMES),
        st.sampled_from(LOGICAL),
        st.builds(
            lambda syms: {"type": "enum", "name": names.new(), "symbols": syms},
            st.lists(st.sampled_from(["A", "B", "C", "D", "E_1"]), min_size=1, unique=True),
        ),
        st.sampled_from(["plain", "uuid", "decimal"]).map(lambda k: fixed(k)(None)),
    )


@st.composite
def avro_schemas(draw: st.DrawFn, max_depth: int = 3) -> dict[str, Any]:
    """A record schema with random fields of every kind, nested up to ``max_depth``."""
    names = _Names()

    def typ(depth: int) -> st.SearchStrategy[Any]:
        if depth >= max_depth:
            return _leaf(names)
        inner = st.deferred(lambda: typ(depth + 1))
        return st.one_of(
            _leaf(names),
            st.builds(lambda t: {"type": "array", "items": t}, inner),
            st.builds(lambda t: {"type": "map", "values": t}, inner),
            st.builds(lambda t, first: ["null", t] if first else [t, "null"], inner.filter(
                lambda t: not isinstance(t, list) and t != "null"), st.booleans()),
            _union(inner),
            st.builds(lambda fs: record(fs), st.lists(inner, min_size=0, max_size=4)),
        )

    def record(field_types: list[Any]) -> dict[str, Any]:
        return {
            "type": "record",
            "name": names.new(),
            "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(field_types)],
        }

    fields = draw(st.lists(typ(1), min_size=1, max_size=5))
    return record(fields)


def _union(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    def key(t: Any) -> str:
        if isinstance(t, dict):
            return t.get("name") or t["type"]
        return str(t)

    def plain(t: Any) -> bool:
        # fastavro picks a union branch by trying each in turn: an enum symbol or a string would
        # be written as uuid text or raise in date parsing, so unions hold no enums or logical
        # types here (tests/test_avro_decode.py covers those in unions by hand)
        return not isinstance(t, list) and not (
            isinstance(t, dict) and ("logicalType" in t or t["type"] == "enum")
        )

    def kinds(t: Any) -> str:
        return t["type"] if isinstance(t, dict) else str(t)

    def distinguishable(ts: list[Any]) -> bool:
        # fastavro writes bytes into a "string" branch listed before "bytes" (and the reverse),
        # and a dict meant for a record into a map branch when one of the record's fields does
        # not take its value as written (a uuid fixed given as bytes): the map's values then
        # get bytes that were never drawn for them
        found = {kinds(t) for t in ts}
        return not ({"string", "bytes"} <= found or {"record", "map"} <= found)

    return st.lists(
        inner.filter(plain), min_size=1, max_size=4, unique_by=key
    ).filter(distinguishable).map(
        lambda ts: ts if len(ts) != 2 or "null" not in ts or "boolean" in ts
        else [*ts, "boolean"]
    )


_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)
_UTC = dt.timezone.utc
_EXACT = decimal.Context(prec=100)  # the default 28 digits would round 40-digit values


def _decimal_digits(precision: int) -> st.SearchStrategy[int]:
    """Unscaled values of at most 28 digits: fastavro's writer scales in Python's default decimal
    context (28 digits) and would round longer values (tests with more digits write by hand)."""
    bound = 10 ** min(precision, 28)
    return st.integers(-bound + 1, bound - 1)


def values_for(t: AvroType) -> st.SearchStrategy[Any]:
    """Values fastavro's writer accepts for ``t`` (a parsed type)."""
    if isinstance(t, Primitive):
        lt = t.logical_type
        if lt == "date":
            return st.dates()
        if lt == "time-millis":
            return st.times().map(lambda v: v.replace(microsecond=v.microsecond // 1000 * 1000))
        if lt == "time-micros":
            return st.times()
        if lt and "timestamp" in lt:
            zone = st.just(_UTC) if lt.startswith("timestamp") else st.none()
            d = st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1), timezones=zone)
            if lt.endswith("millis"):
                return d.map(lambda v: v.replace(microsecond=v.microsecond // 1000 * 1000))
            return d
        if lt == "uuid":
            return st.uuids()
        if lt == "decimal":
            assert t.precision is not None and t.scale is not None
            digits = _decimal_digits(t.precision)
            return digits.map(lambda v: decimal.Decimal(v).scaleb(-t.scale, _EXACT))
        return {
            "null": st.none(),
            "boolean": st.booleans(),
            "int": _INT32,
            "long": _INT64,
            "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False),
            "bytes": st.binary(max_size=20),
            "string": st.text(max_size=20),
        }[t.type]
    if isinstance(t, Enum):
        return st.sampled_from(t.symbols)
    if isinstance(t, Fixed):
        if t.logical_type == "uuid":  # fastavro writes (and reads) a fixed uuid as its bytes
            return st.uuids().map(lambda u: u.bytes)
        if t.logical_type == "decimal":
            assert t.precision is not None and t.scale is not None
            digits = _decimal_digits(t.precision)
            return digits.map(lambda v: decimal.Decimal(v).scaleb(-t.scale, _EXACT))
        return st.binary(min_size=t.size, max_size=t.size)
    if isinstance(t, Array):
        return st.lists(st.deferred(lambda: values_for(t.items)), max_size=4)
    if isinstance(t, Map):
        return st.dictionaries(st.text(max_size=5), st.deferred(lambda: values_for(t.values)),
                               max_size=3)
    if isinstance(t, Union):
        return st.one_of(*[values_for(b) for b in t.branches])
    if isinstance(t, Record):
        return st.fixed_dictionaries({f.name: values_for(f.type) for f in t.fields})
    raise AssertionError(t)


def uuids_as_bytes(v: Any) -> Any:
    """fastavro reads a string uuid as a UUID and a fixed one as bytes: compare both as bytes."""
    if isinstance(v, uuid.UUID):
        return v.bytes
    if isinstance(v, dict):
        return {k: uuids_as_bytes(x) for k, x in v.items()}
    if isinstance(v, list):
        return [uuids_as_bytes(x) for x in v]
    return v


def write(schema: Any, records: list[Any]) -> list[bytes]:
    """Each record as one message written by fastavro, the reference writer."""
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out


def zigzag(n: int) -> bytes:
    """An Avro long as its bytes (zigzag varint), for hand-made messages."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@st.composite
def schema_and_records(draw: st.DrawFn, max_size: int = 6) -> tuple[dict[str, Any], list[Any]]:
    """A schema and records of it that fastavro can write."""
    schema = draw(avro_schemas())
    records = draw(st.lists(values_for(parse_schema(schema).root), max_size=max_size))
    try:  # fastavro tries union branches in turn; some raise instead of declining a value
        write(schema, records)
    except (ValueError, TypeError):
        assume(False)
    return schema, records
