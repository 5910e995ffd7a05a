"""Arrow schema -> Avro schema: the inverse of the mapping in docs/avro.md.

Used by ``write_ocf`` and ``AvroSerializer`` when no Avro schema is given. A schema that came
from decoding Avro (its metadata holds ``avro.schema``) maps back to that Avro schema as long as
the columns still match it, so decode -> write round trips keep enums, fixed sizes and unions.
A binary field whose metadata holds ``avro.schema`` (a recursive record's values kept as their
own encoding, as decode gives them) maps back to that record.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa
import pyarrow.types as pt

from arrowstash.avro.schema import MAX_DEPTH
from arrowstash.errors import AvroSchemaError

__all__ = ["from_arrow_schema"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TIMESTAMP = {"s": "millis", "ms": "millis", "us": "micros", "ns": "nanos"}


def from_arrow_schema(arrow_schema: pa.Schema | pa.Table | pa.RecordBatch,
                      name: str = "Record", namespace: str | None = None) -> Any:
    """The Avro schema (parsed) whose decoding gives ``arrow_schema``.

    Nullable fields become ``["null", T]`` with default null; a dictionary of strings becomes
    an ``enum`` when a table or batch is passed whose dictionary values are valid symbols (a
    bare schema has no symbols, so it maps to ``string``). Types Avro cannot hold (unsigned
    64-bit, nanosecond times, durations, non-string map keys, ...) raise ``AvroSchemaError``
    naming the field.
    """
    from arrowstash.avro.schema import parse_schema, to_arrow_schema

    table = None if isinstance(arrow_schema, pa.Schema) else arrow_schema
    schema = arrow_schema if table is None else table.schema
    stored = (schema.metadata or {}).get(b"avro.schema")
    if stored is not None:
        try:
            parsed = parse_schema(stored.decode())
            if to_arrow_schema(parsed).remove_metadata() == schema.remove_metadata():
                return parsed
        except (AvroSchemaError, ValueError):
            pass  # stale or foreign metadata: map the columns themselves
    if not _NAME.match(name):
        raise AvroSchemaError(f"record name {name!r} is not a valid Avro name")
    mapper = _Mapper(table, namespace)
    record = {
        "type": "record",
        "name": name,
        "fields": [mapper.field(f, name, i) for i, f in enumerate(schema)],
    }
    if namespace:
        record["namespace"] = namespace
    return parse_schema(json.dumps(record))


class _Mapper:
    def __init__(self, table: pa.Table | pa.RecordBatch | None, namespace: str | None) -> None:
        self.table = table
        self.namespace = namespace
        self.names: set[str] = set()
        self.kept_records: set[str] = set()
        self.depth = 0

    def unique(self, base: str) -> str:
        """A record/enum/fixed name not used yet (Avro names must be unique in a schema)."""
        candidate, n = base, 1
        while candidate in self.names:
            n += 1
            candidate = f"{base}{n}"
        self.names.add(candidate)
        return candidate

    def field(self, field: pa.Field, path: str, top_index: int | None = None) -> dict[str, Any]:
        where = f"{path}.{field.name}"
        if not _NAME.match(field.name):
            raise AvroSchemaError(
                f"{where}: {field.name!r} is not a valid Avro field name "
                "(letters, digits and _, not starting with a digit); rename the column"
            )
        kind = self.kept(field, where) or self.type(field.type, where, top_index)
        if field.nullable and field.type != pa.null():
            return {"name": field.name, "type": ["null", kind], "default": None}
        return {"name": field.name, "type": kind}

    def type(self, t: pa.DataType, where: str, top_index: int | None = None,
             hint: str | None = None) -> Any:
        """The Avro type of ``t``; ``hint`` names a named type (a union child's name)."""
        found = _primitive(t)
        if found is None:
            found = self.logical(t, where, hint)
        if found is None:
            # Each Arrow level is at least one Avro level: stop before recursing past the limit.
            if self.depth >= MAX_DEPTH:
                raise AvroSchemaError(f"{where}: types nest deeper than {MAX_DEPTH} levels")
            self.depth += 1
            try:
                found = self.nested(t, where, top_index, hint)
            finally:
                self.depth -= 1
        return found

    def logical(self, t: pa.DataType, where: str, hint: str | None) -> Any:
        """The Avro type of a logical or fixed-size Arrow type, else None."""
        if isinstance(t, pa.BaseExtensionType):
            if t.extension_name == "arrow.uuid":
                return {"type": "string", "logicalType": "uuid"}
            raise AvroSchemaError(f"{where}: extension type {t.extension_name} has no Avro type")
        if pt.is_fixed_size_binary(t):
            return {"type": "fixed", "name": self.unique(hint or _type_name(where, "Fixed")),
                    "size": t.byte_width}
        if pt.is_decimal(t):
            if t.bit_width not in (128, 256):
                raise AvroSchemaError(f"{where}: {t} has no Avro type; cast to decimal128")
            return {"type": "bytes", "logicalType": "decimal", "precision": t.precision,
                    "scale": t.scale}
        if pt.is_date(t):
            return {"type": "int", "logicalType": "date"}
        if pt.is_time32(t):
            return {"type": "int", "logicalType": "time-millis"}
        if pt.is_time64(t):
            if t.unit == "ns":
                raise AvroSchemaError(f"{where}: Avro times stop at microseconds; cast {t} to "
                                      "time64('us')")
            return {"type": "long", "logicalType": "time-micros"}
        if pt.is_timestamp(t):
            prefix = "timestamp" if t.tz is not None else "local-timestamp"
            return {"type": "long", "logicalType": f"{prefix}-{_TIMESTAMP[t.unit]}"}
        if t == pa.month_day_nano_interval():
            return {"type": "fixed", "name": self.unique(hint or _type_name(where, "Duration")),
                    "size": 12, "logicalType": "duration"}
        return None

    def nested(self, t: pa.DataType, where: str, top_index: int | None, hint: str | None) -> Any:
        """The Avro type of a dictionary, list, map, union or struct type."""
        if pt.is_dictionary(t):
            return self.dictionary(t, where, top_index)
        if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t) or \
                _is(t, "is_list_view") or _is(t, "is_large_list_view"):
            return {"type": "array", "items": self.value(t.value_field, f"{where}[]")}
        if pt.is_map(t):
            if not (pt.is_string(t.key_type) or pt.is_large_string(t.key_type)):
                raise AvroSchemaError(f"{where}: Avro map keys are strings, not {t.key_type}")
            return {"type": "map", "values": self.value(t.item_field, f"{where}{{}}")}
        if pt.is_union(t):
            return [self.kept(c, f"{where}|{c.name}")
                    or self.type(c.type, f"{where}|{c.name}", hint=_hint(c.name))
                    for c in (t.field(i) for i in range(t.num_fields))]
        if pt.is_struct(t):
            record_name = self.unique(hint or _type_name(where, "Record"))
            return {"type": "record", "name": record_name,
                    "fields": [self.field(t.field(i), where) for i in range(t.num_fields)]}
        raise AvroSchemaError(f"{where}: Arrow type {t} has no Avro equivalent; cast the column")

    def value(self, field: pa.Field, where: str) -> Any:
        kind = self.kept(field, where) or self.type(field.type, where)
        return ["null", kind] if field.nullable and field.type != pa.null() else kind

    def kept(self, field: pa.Field, where: str) -> Any:
        """The record of a binary field whose metadata holds its schema (a recursive record's
        values kept as their encoding): defined where first met, named where met again."""
        from arrowstash.avro.schema import Record, parse_schema

        stored = (field.metadata or {}).get(b"avro.schema")
        t = field.type
        if stored is None or _primitive(t) != "bytes" or pt.is_fixed_size_binary(t):
            return None
        try:
            parsed = parse_schema(stored.decode())
        except (AvroSchemaError, UnicodeDecodeError) as exc:
            raise AvroSchemaError(f"{where}: the field's avro.schema metadata: {exc}") from None
        if not isinstance(parsed.root, Record):
            return None
        if parsed.root.name in self.kept_records:
            return parsed.root.name
        self.kept_records.add(parsed.root.name)
        self.names.update(n.rpartition(".")[2] for n in parsed.names)
        return json.loads(parsed.json)

    def dictionary(self, t: pa.DictionaryType, where: str, top_index: int | None) -> Any:
        if not (pt.is_string(t.value_type) or pt.is_large_string(t.value_type)):
            return self.type(t.value_type, where)
        symbols = self.symbols(top_index) if top_index is not None else None
        if symbols is None:
            return "string"
        return {"type": "enum", "name": self.unique(_type_name(where, "Enum")),
                "symbols": symbols}

    def symbols(self, index: int) -> list[str] | None:
        """The column's dictionary as enum symbols, if they are one dictionary of valid names."""
        if self.table is None:
            return None
        column = self.table.column(index)
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        dictionaries = {tuple(chunk.dictionary.to_pylist()) for chunk in chunks}
        if len(dictionaries) != 1:
            return None
        symbols = list(dictionaries.pop())
        if len(set(symbols)) != len(symbols) or not all(
                isinstance(s, str) and _NAME.match(s) for s in symbols):
            return None
        return symbols


def _hint(child_name: str) -> str | None:
    """A dense-union child's name is its branch's (full)name for named types."""
    short = child_name.rpartition(".")[2]
    return short if _NAME.match(short) and child_name not in _PRIMITIVE_NAMES else None


_PRIMITIVE_NAMES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string",
                    "array", "map", "record", "enum", "fixed"}


def _type_name(where: str, fallback: str) -> str:
    """A named type's name from its field path: ``Record.trip.stops`` -> ``trip_stops``."""
    parts = [p.strip("[]{}").replace("|", "_") for p in where.split(".")[1:]]
    name = "_".join(p for p in parts if p)
    return name if _NAME.match(name) else fallback


def _is(t: pa.DataType, test: str) -> bool:
    check = getattr(pt, test, None)
    return bool(check(t)) if check is not None else False


def _primitive(t: pa.DataType) -> str | None:
    """The Avro primitive an Arrow type maps to, or None."""
    if pt.is_null(t):
        return "null"
    if pt.is_boolean(t):
        return "boolean"
    if pt.is_int8(t) or pt.is_int16(t) or pt.is_int32(t) or pt.is_uint8(t) or pt.is_uint16(t):
        return "int"
    if pt.is_int64(t) or pt.is_uint32(t):
        return "long"
    if pt.is_float16(t) or pt.is_float32(t):
        return "float"
    if pt.is_float64(t):
        return "double"
    if pt.is_string(t) or pt.is_large_string(t) or _is(t, "is_string_view"):
        return "string"
    if pt.is_binary(t) or pt.is_large_binary(t) or _is(t, "is_binary_view"):
        return "bytes"
    return None
