"""Python values (as fastavro reads and writes them) -> Arrow arrays of the Avro-Arrow mapping,
and back (``read_back``).

Written independently of the encoder, so the encode tests do not check the encoder against
itself. A union value goes to the branch fastavro's own writer picks for it, so both writers
must produce the same bytes.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pyarrow as pa

from arrowstash.avro.arrow_types import arrow_type, is_nullable_union, union_child_name
from arrowstash.avro.schema import Array, AvroType, Enum, Fixed, Map, Primitive, Record, Schema
from arrowstash.avro.schema import Union as AvroUnion


def to_batch(schema: Schema, records: list[dict[str, Any]]) -> pa.RecordBatch:
    root = schema.root
    assert isinstance(root, Record)
    columns = [to_arrow(f.type, [r[f.name] for r in records]) for f in root.fields]
    return pa.RecordBatch.from_arrays(columns, names=[f.name for f in root.fields])


def to_arrow(t: AvroType, values: list[Any]) -> pa.Array:
    """``None`` is a null wherever it appears (also where the type is not nullable: values under
    a null parent are never encoded)."""
    if isinstance(t, AvroUnion):
        if is_nullable_union(t):
            return to_arrow(t.branches[1 - (t.null_index or 0)], values)
        return _union(t, values)
    if isinstance(t, Record):
        mask = pa.array([v is None for v in values], pa.bool_())
        children = [to_arrow(f.type, [None if v is None else v[f.name] for v in values])
                    for f in t.fields]
        fields = [pa.field(f.name, c.type) for f, c in zip(t.fields, children, strict=True)]
        if not fields:
            return pa.StructArray.from_arrays([], fields=[], mask=mask) if values else pa.array(
                [], pa.struct([]))
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if isinstance(t, (Array, Map)):
        offsets, flat = [0], []
        for v in values:
            items = [] if v is None else (v if isinstance(t, Array) else list(v.items()))
            flat.extend(items)
            offsets.append(len(flat))
        mask = pa.array([v is None for v in values], pa.bool_())
        offs = pa.array(offsets, pa.int32())
        if isinstance(t, Array):
            child = to_arrow(t.items, flat)
            return pa.ListArray.from_arrays(offs, child, pa.list_(child.type), mask=mask)
        keys = pa.array([k for k, _ in flat], pa.string())
        items = to_arrow(t.values, [v for _, v in flat])
        return pa.MapArray.from_arrays(offs, keys, items, pa.map_(pa.string(), items.type),
                                       mask=mask)
    if isinstance(t, Enum):
        indices = pa.array([None if v is None else t.symbols.index(v) for v in values], pa.int32())
        return pa.DictionaryArray.from_arrays(indices, pa.array(list(t.symbols), pa.string()))
    at = arrow_type(t)
    if isinstance(at, pa.ExtensionType):  # uuid
        storage = pa.array([None if v is None else v.bytes for v in values], pa.binary(16))
        return pa.ExtensionArray.from_storage(at, storage)
    if isinstance(t, Fixed) and t.logical_type is None:
        return pa.array(values, pa.binary(t.size))
    assert isinstance(t, (Primitive, Fixed))
    return pa.array(values, at)


# Keyed by the union itself (compared by identity), which the dict keeps alive: keyed by id(),
# a union collected after one example left its parsed schema to a new union at the same address.
_PARSED: dict[AvroUnion, Any] = {}


def fastavro_branch(t: AvroUnion, value: Any) -> int:
    """The branch fastavro's writer chooses for ``value``."""
    parsed = _PARSED.get(t)
    if parsed is None:
        parsed = _PARSED[t] = fastavro.parse_schema(json.loads(Schema(t, {}).json))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, value)
    first = out.getvalue()[0]
    return first >> 1  # fewer than 64 branches: one byte


def _union(t: AvroUnion, values: list[Any]) -> pa.Array:
    n = len(t.branches)
    types, offsets = [], []
    members: list[list[Any]] = [[] for _ in range(n)]
    for v in values:
        if v is None:
            b = t.null_index if t.null_index is not None else 0
        else:
            b = fastavro_branch(t, v)
        types.append(b)
        offsets.append(len(members[b]))
        members[b].append(v)
    children = [
        pa.nulls(len(m)) if b.type == "null" else to_arrow(b, m)
        for b, m in zip(t.branches, members, strict=True)
    ]
    return pa.UnionArray.from_dense(
        pa.array(types, pa.int8()),
        pa.array(offsets, pa.int32()),
        children,
        [union_child_name(b) for b in t.branches],
        list(range(n)),
    )


def read_back(data: pa.RecordBatch | pa.Table) -> list[dict[str, Any]]:
    """The rows of a decoded batch or table as fastavro reads them: each value kept as its own
    encoding (a recursive record's, in a column whose field metadata holds its schema) decoded
    with that schema, level after level, by arrowstash's ``decode``."""
    if isinstance(data, pa.Table):
        batches = data.combine_chunks().to_batches()
        if not batches:
            return [{} for _ in range(data.num_rows)]  # no columns (or no rows)
        data = batches[0]
    batch = data
    columns = [_read_back(batch.column(i), batch.schema.field(i))
               for i in range(batch.num_columns)]
    return [dict(zip(batch.schema.names, row, strict=True)) for row in zip(*columns, strict=True)] \
        if columns else [{} for _ in range(batch.num_rows)]


def _read_back(arr: pa.Array, field: pa.Field) -> list[Any]:
    from arrowstash.avro import decode

    meta = field.metadata or {}
    if b"avro.schema" in meta:
        values = arr.to_pylist()
        present = [v for v in values if v is not None]
        inner = iter(read_back(decode(present, meta[b"avro.schema"].decode())) if present else ())
        return [None if v is None else next(inner) for v in values]
    t = arr.type
    valid = arr.is_valid().to_pylist()
    if pa.types.is_struct(t):
        kids = [_read_back(arr.field(i), t.field(i)) for i in range(t.num_fields)]
        names = [t.field(i).name for i in range(t.num_fields)]
        return [dict(zip(names, row, strict=True)) if ok else None
                for ok, row in zip(valid, zip(*kids, strict=True) if kids else
                                   [()] * len(arr), strict=True)]
    if pa.types.is_list(t) or pa.types.is_map(t):
        offsets = arr.offsets.to_pylist()
        if pa.types.is_map(t):
            keys = arr.keys.to_pylist()
            items = _read_back(arr.items, t.item_field)
        else:
            items = _read_back(arr.values, t.value_field)
        out: list[Any] = []
        for i, ok in enumerate(valid):
            lo, hi = offsets[i], offsets[i + 1]
            if not ok:
                out.append(None)
            elif pa.types.is_map(t):
                out.append(dict(zip(keys[lo:hi], items[lo:hi], strict=True)))
            else:
                out.append(items[lo:hi])
        return out
    if pa.types.is_union(t):
        kids = [_read_back(arr.field(i), t.field(i)) for i in range(t.num_fields)]
        codes, offs = arr.type_codes.to_pylist(), arr.offsets.to_pylist()
        return [kids[c][o] for c, o in zip(codes, offs, strict=True)]
    return arr.to_pylist()
