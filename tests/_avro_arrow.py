"""Python values (as fastavro reads and writes them) -> Arrow arrays of the Avro-Arrow mapping.

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
