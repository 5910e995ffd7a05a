"""The Avro -> Arrow type mapping (the table in docs/avro.md), shared by decoder and encoder."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from arrowstash.avro.types import Array, AvroType, Enum, Fixed, Map, Primitive, Record, Union
from arrowstash.errors import AvroSchemaError

__all__ = ["arrow_schema", "arrow_type", "is_nullable_union", "union_child_name"]

_PLAIN = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_LOGICAL = {
    "date": pa.date32(),
    "time-millis": pa.time32("ms"),
    "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "timestamp-nanos": pa.timestamp("ns", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"),
    "local-timestamp-micros": pa.timestamp("us"),
    "local-timestamp-nanos": pa.timestamp("ns"),
}


def arrow_schema(root: AvroType, json: str) -> Any:
    """The ``pyarrow.Schema`` of what a schema (its parsed ``root`` type, its ``json``) decodes
    to: a record's fields become the columns, any other type one column named ``value``. The
    metadata keeps the Avro schema's JSON."""
    if isinstance(root, Record):
        fields = [_field(f.name, f.type, (root.name,)) for f in root.fields]
    else:
        fields = [_field("value", root, ())]
    return pa.schema(fields, metadata={"avro.schema": json})


def is_nullable_union(t: AvroType) -> bool:
    """``["null", T]`` or ``[T, "null"]``: maps to a nullable ``T``, not to a dense union."""
    return isinstance(t, Union) and len(t.branches) == 2 and t.null_index is not None


def union_child_name(t: AvroType) -> str:
    """The dense-union child's field name: the fullname of a named type, else its type name."""
    return t.name if isinstance(t, (Record, Enum, Fixed)) else t.type


def arrow_type(t: AvroType, _stack: tuple[str, ...] = ()) -> Any:
    """The Arrow type of one Avro type (a nullable union maps to its non-null branch's type)."""
    if isinstance(t, Primitive):
        if t.logical_type == "decimal":
            assert t.precision is not None and t.scale is not None
            return _decimal(t.precision, t.scale)
        if t.logical_type == "uuid":
            return pa.uuid()
        if t.logical_type:
            return _LOGICAL[t.logical_type]
        return _PLAIN[t.type]
    if isinstance(t, Union):
        if is_nullable_union(t):
            return arrow_type(t.branches[1 - (t.null_index or 0)], _stack)
        children = [
            pa.field(union_child_name(b), arrow_type(b, _stack), nullable=b.type == "null")
            for b in t.branches
        ]
        return pa.dense_union(children, type_codes=list(range(len(children))))
    if isinstance(t, Array):
        return pa.list_(_field("item", t.items, _stack))
    if isinstance(t, Map):
        key = pa.field("key", pa.string(), nullable=False)
        return pa.map_(key, _field("value", t.values, _stack))
    if isinstance(t, Enum):
        return pa.dictionary(pa.int32(), pa.string())
    if isinstance(t, Fixed):
        if t.logical_type == "decimal":
            assert t.precision is not None and t.scale is not None
            return _decimal(t.precision, t.scale)
        if t.logical_type == "uuid":
            return pa.uuid()
        if t.logical_type == "duration":
            return pa.month_day_nano_interval()
        return pa.binary(t.size)
    if t.name in _stack:
        raise AvroSchemaError(f"recursive type {t.name!r} cannot map to Arrow")
    inner = (*_stack, t.name)
    return pa.struct([_field(f.name, f.type, inner) for f in t.fields])


def _field(name: str, t: AvroType, stack: tuple[str, ...]) -> Any:
    nullable = (isinstance(t, Union) and t.null_index is not None) or t.type == "null"
    return pa.field(name, arrow_type(t, stack), nullable=nullable)


def _decimal(precision: int, scale: int) -> Any:
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)

