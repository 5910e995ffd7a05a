"""The Avro -> Arrow type mapping (the table in docs/avro.md), shared by decoder and encoder."""

from __future__ import annotations

import json
import weakref
from typing import Any

import pyarrow as pa

from arrowstash.avro.types import (
    Array,
    AvroType,
    Enum,
    Fixed,
    Map,
    Primitive,
    Record,
    Union,
    full_json,
)

__all__ = ["SCHEMA_KEY", "arrow_schema", "arrow_type", "is_nullable_union", "is_recursive",
           "kept_as_bytes", "record_struct", "union_child_name"]

#: The metadata key of the Avro schema: on the Arrow schema (the whole schema) and on the field of
#: a column of values kept as their own encoding (the standalone schema of their record type).
SCHEMA_KEY = "avro.schema"

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


def arrow_schema(root: AvroType, schema_json: str) -> Any:
    """The ``pyarrow.Schema`` of what a schema (its parsed ``root`` type, its ``json``) decodes
    to: a record's fields become the columns, any other type one column named ``value``. The
    metadata keeps the Avro schema's JSON."""
    if isinstance(root, Record):
        fields = [_field(f.name, f.type) for f in root.fields]
    else:
        fields = [_field("value", root)]
    return pa.schema(fields, metadata={SCHEMA_KEY: schema_json})


def is_nullable_union(t: AvroType) -> bool:
    """``["null", T]`` or ``[T, "null"]``: maps to a nullable ``T``, not to a dense union."""
    return isinstance(t, Union) and len(t.branches) == 2 and t.null_index is not None


def union_child_name(t: AvroType) -> str:
    """The dense-union child's field name: the fullname of a named type, else its type name."""
    return t.name if isinstance(t, (Record, Enum, Fixed)) else t.type


def is_recursive(t: Record) -> bool:
    """Whether a value of record ``t`` can hold another value of ``t`` (through its fields,
    arrays, maps, unions and other records): such a record cannot map to a finite Arrow type."""
    known = _RECURSIVE.get(t)
    if known is None:
        known = _RECURSIVE[t] = _reaches(t)
    return known


_RECURSIVE: weakref.WeakKeyDictionary[Record, bool] = weakref.WeakKeyDictionary()


def _reaches(target: Record) -> bool:
    todo: list[AvroType] = [f.type for f in target.fields]
    seen: set[int] = set()
    while todo:
        t = todo.pop()
        if t is target:
            return True
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, Record):
            todo.extend(f.type for f in t.fields)
        elif isinstance(t, Union):
            todo.extend(t.branches)
        elif isinstance(t, Array):
            todo.append(t.items)
        elif isinstance(t, Map):
            todo.append(t.values)
    return False


def kept_as_bytes(t: AvroType) -> Record | None:
    """The recursive record whose values type ``t`` (or the value branch of a nullable union)
    keeps as their own Avro encoding in a binary column, or None."""
    if is_nullable_union(t):
        assert isinstance(t, Union)
        t = t.branches[1 - (t.null_index or 0)]
    return t if isinstance(t, Record) and is_recursive(t) else None


def arrow_type(t: AvroType) -> Any:
    """The Arrow type of one Avro type (a nullable union maps to its non-null branch's type; a
    recursive record, wherever it is not the top-level type, to ``binary``: see
    ``kept_as_bytes``)."""
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
            return arrow_type(t.branches[1 - (t.null_index or 0)])
        children = [_field(union_child_name(b), b, nullable=b.type == "null")
                    for b in t.branches]
        return pa.dense_union(children, type_codes=list(range(len(children))))
    if isinstance(t, Array):
        return pa.list_(_field("item", t.items))
    if isinstance(t, Map):
        key = pa.field("key", pa.string(), nullable=False)
        return pa.map_(key, _field("value", t.values))
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
    return pa.binary() if is_recursive(t) else record_struct(t)


def record_struct(t: Record) -> Any:
    """The struct of a record's fields (what ``arrow_type`` gives a record that is not recursive,
    and a recursive one at the top level)."""
    return pa.struct([_field(f.name, f.type) for f in t.fields])


def _field(name: str, t: AvroType, nullable: bool | None = None) -> Any:
    """A field of type ``t``; values kept as bytes carry their record's schema in its metadata."""
    if nullable is None:
        nullable = (isinstance(t, Union) and t.null_index is not None) or t.type == "null"
    kept = kept_as_bytes(t)
    metadata = None if kept is None else {SCHEMA_KEY: type_json(kept)}
    return pa.field(name, arrow_type(t), nullable=nullable, metadata=metadata)


def type_json(t: AvroType) -> str:
    """The JSON of type ``t`` on its own: every named type it uses defined inside it."""
    return json.dumps(full_json(t), separators=(",", ":"))


def _decimal(precision: int, scale: int) -> Any:
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
