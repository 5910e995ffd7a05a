"""Schema resolution (the specification's "writer schema vs reader schema") on decoded columns.

Messages are decoded with the schema they were written with; this module then turns the Arrow
columns into what the reader's schema decodes to, column by column with Arrow kernels (casts,
takes, dictionary remaps), never value by value in Python:

- record fields are matched by name or by the reader field's aliases; fields only the reader has
  take their default (a constant column), fields only the writer has are dropped;
- promotions int -> long -> float -> double, string <-> bytes; logical types over the same
  underlying type are reinterpreted (a ``long`` read as ``timestamp-micros``);
- enum symbols are remapped to the reader's order, unknown ones to the reader's default;
- unions: each writer branch goes to the first reader branch that matches it exactly, else the
  first it can be promoted to; a non-union on one side matches the other side's union branches;
- named types match by unqualified name or one of the reader's aliases.

Schemas that can never match raise :class:`AvroSchemaError` naming the path; values whose
resolution fails only for some data (a union branch or enum symbol the reader lacks) raise
:class:`AvroDecodeError` naming the value.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowstash.avro.arrow_types import (
    arrow_type,
    is_nullable_union,
    is_recursive,
    record_struct,
    type_json,
)
from arrowstash.avro.default_arrays import default_array, dense_union
from arrowstash.avro.encoder import encode
from arrowstash.avro.numpy_import import numpy as np
from arrowstash.avro.schema import (
    Array,
    AvroType,
    Enum,
    Fixed,
    Map,
    NamedType,
    Primitive,
    PrunedSchema,
    Record,
    Schema,
    SchemaLike,
    Union,
    describe,
    parse_schema,
    type_canonical_form,
)
from arrowstash.avro.writer_decoder import decode_messages
from arrowstash.errors import AvroDecodeError, AvroSchemaError

__all__ = ["pruned", "resolve"]

#: Writer primitive -> the reader primitives it may be read as (besides itself).
_PROMOTIONS = {
    "int": ("long", "float", "double"),
    "long": ("float", "double"),
    "float": ("double",),
    "string": ("bytes",),
    "bytes": ("string",),
}
#: Logical types whose Arrow arrays are their underlying ints, viewed with another type.
_TEMPORAL = {"date", "time-millis", "time-micros", "timestamp-millis", "timestamp-micros",
             "timestamp-nanos", "local-timestamp-millis", "local-timestamp-micros",
             "local-timestamp-nanos"}


def resolve(batch: pa.RecordBatch, writer: SchemaLike, reader: SchemaLike) -> pa.RecordBatch:
    """``batch`` (decoded with ``writer``) as if it had been decoded with ``reader``."""
    w, r = parse_schema(writer), parse_schema(reader)
    target = r.arrow_schema
    if isinstance(w.root, Record) and batch.num_columns:
        column: pa.Array = pa.StructArray.from_arrays(batch.columns, fields=list(batch.schema))
    elif isinstance(w.root, Record):  # no fields (or none the reader reads): only a length
        column = pa.Array.from_buffers(pa.struct([]), batch.num_rows, [None], children=[])
    else:
        column = batch.column(0)
    out = _resolve(column, w.root, r.root, _path(r.root))
    if isinstance(r.root, Record) and not out.type.num_fields:  # keep the row count
        return pa.RecordBatch.from_struct_array(out).replace_schema_metadata(target.metadata)
    if isinstance(r.root, Record):
        return pa.RecordBatch.from_arrays(
            [out.field(i) for i in range(out.type.num_fields)], schema=target)
    return pa.RecordBatch.from_arrays([out], schema=target)


def _path(t: AvroType) -> str:
    return t.name.rpartition(".")[2] if isinstance(t, (Record, Enum, Fixed)) else t.type


# -- matching ------------------------------------------------------------------------------------

def _short(name: str) -> str:
    return name.rpartition(".")[2]


def _same_name(w: Record | Enum | Fixed, r: Record | Enum | Fixed) -> bool:
    return _short(w.name) == _short(r.name) or any(
        alias == w.name or _short(alias) == _short(w.name) for alias in r.aliases
    )


def _matches(w: AvroType, r: AvroType, promote: bool) -> bool:
    """Whether writer type ``w`` can be read as reader type ``r`` (neither a union), exactly
    (same kind and name) or, with ``promote``, through a promotion."""
    if isinstance(w, Primitive) and isinstance(r, Primitive):
        return w.type == r.type or (promote and r.type in _PROMOTIONS.get(w.type, ()))
    if type(w) is not type(r):
        return False
    if isinstance(w, Fixed):
        assert isinstance(r, Fixed)
        return w.size == r.size and _same_name(w, r)
    if isinstance(w, (Record, Enum)):
        return _same_name(w, r)  # type: ignore[arg-type]
    return True  # arrays and maps: their items are resolved recursively


def _branch_for(w: AvroType, r: Union) -> int | None:
    """The reader union branch a writer value of type ``w`` goes to (None: no match)."""
    for promote in (False, True):
        for j, branch in enumerate(r.branches):
            if _matches(w, branch, promote):
                return j
    return None


# -- what to decode ------------------------------------------------------------------------------

def pruned(writer: Schema, reader: Schema) -> Schema:
    """``writer`` without the record fields ``reader`` never reads (a :class:`PrunedSchema`), or
    ``writer`` itself when every field is read. Decoding with it reads past the dropped fields
    without mapping them to Arrow, so a recursive field the reader drops is no obstacle, and
    dropped columns cost no buffers; ``resolve`` takes it as the writer schema."""
    reads = _Reads()
    reads.walk(writer.root, reader.root)
    built: dict[str, Record] = {}
    names: dict[str, NamedType] = {}
    skipped: dict[str, Record] = {}

    def build(t: AvroType, top: bool = False) -> AvroType:
        if isinstance(t, Union):
            return Union(tuple(build(b) for b in t.branches))
        if isinstance(t, Array):
            return Array(build(t.items), t.props)
        if isinstance(t, Map):
            return Map(build(t.values), t.props)
        if not isinstance(t, Record):
            if isinstance(t, (Enum, Fixed)):
                names[t.name] = t
            return t
        if is_recursive(t) and not top:
            # kept whole: below the top its values are kept as the writer's bytes (read past),
            # so their schema must be the writer's whole record
            for name, named in _named_in(t).items():
                names.setdefault(name, named)
            return t
        if t.name in built:
            return built[t.name]
        record = built[t.name] = dataclasses.replace(t, fields=())
        names[t.name] = record
        kept = [f for f in t.fields if t.name in reads.whole or f.name in reads.fields[t.name]]
        if len(kept) < len(t.fields):
            skipped[t.name] = t
        object.__setattr__(record, "fields",
                           tuple(dataclasses.replace(f, type=build(f.type)) for f in kept))
        return record

    root = build(writer.root, top=True)
    return PrunedSchema(root, names, writer, skipped) if skipped else writer


def _named_in(t: AvroType) -> dict[str, NamedType]:
    """The named types type ``t`` uses, by fullname."""
    found: dict[str, NamedType] = {}
    todo = [t]
    while todo:
        t = todo.pop()
        if isinstance(t, Union):
            todo.extend(t.branches)
        elif isinstance(t, Array):
            todo.append(t.items)
        elif isinstance(t, Map):
            todo.append(t.values)
        elif isinstance(t, (Record, Enum, Fixed)) and t.name not in found:
            found[t.name] = t
            if isinstance(t, Record):
                todo.extend(f.type for f in t.fields)
    return found


class _Reads:
    """Which writer record fields a reader reads, found by walking both schemas the way
    ``resolve`` matches them. A writer type the reader has no match for is read whole (the
    resolution fails later, with its own message, if a value uses it)."""

    def __init__(self) -> None:
        self.fields: dict[str, set[str]] = {}
        self.whole: set[str] = set()
        self.seen: set[tuple[str, str]] = set()

    def walk(self, w: AvroType, r: AvroType) -> None:
        if isinstance(w, Union):
            for branch in w.branches:
                j = _branch_for(branch, r) if isinstance(r, Union) else (
                    0 if _matches(branch, r, True) else None)
                if j is None:
                    self.read_whole(branch)
                else:
                    self.walk(branch, r.branches[j] if isinstance(r, Union) else r)
        elif isinstance(r, Union):
            j = _branch_for(w, r)
            if j is None:
                self.read_whole(w)
            else:
                self.walk(w, r.branches[j])
        elif not _matches(w, r, True):
            self.read_whole(w)
        elif isinstance(w, Record) and isinstance(r, Record):
            if (w.name, r.name) in self.seen:
                return
            self.seen.add((w.name, r.name))
            read = self.fields.setdefault(w.name, set())
            by_name = {f.name: f for f in w.fields}
            for field in r.fields:
                found = next((by_name[n] for n in (field.name, *field.aliases) if n in by_name),
                             None)
                if found is not None:
                    read.add(found.name)
                    self.walk(found.type, field.type)
        elif isinstance(w, Array) and isinstance(r, Array):
            self.walk(w.items, r.items)
        elif isinstance(w, Map) and isinstance(r, Map):
            self.walk(w.values, r.values)

    def read_whole(self, t: AvroType) -> None:
        if isinstance(t, Union):
            for branch in t.branches:
                self.read_whole(branch)
        elif isinstance(t, Array):
            self.read_whole(t.items)
        elif isinstance(t, Map):
            self.read_whole(t.values)
        elif isinstance(t, Record) and t.name not in self.whole:
            self.whole.add(t.name)
            for f in t.fields:
                self.read_whole(f.type)


# -- resolution ----------------------------------------------------------------------------------

def _resolve(arr: pa.Array, w: AvroType, r: AvroType, path: str) -> pa.Array:
    same = _unchanged(w, r)
    if same is not None and arr.type == same:
        return arr  # one type on both sides: the writer's values are the reader's, in place
    if isinstance(w, Union):
        return _from_union(arr, w, r, path)
    if isinstance(r, Union):
        return _to_union(arr, w, r, path)
    return _plain(arr, w, r, path)


@functools.lru_cache(maxsize=4096)
def _unchanged(w: AvroType, r: AvroType) -> pa.DataType | None:
    """The Arrow type of ``r`` if ``w`` and ``r`` have one Parsing Canonical Form, else None.
    The form leaves logical types out: the caller compares the Arrow types too. Rebuilding
    unchanged nested columns (unions, lists, maps, enums) took 4 ms of a 16 ms decode of
    100,000 records of pyruhvro's schema read with a reader that only adds a field. Types are
    keyed by identity, and a parsed schema's types are kept (schema.parse_schema)."""
    return arrow_type(r) if type_canonical_form(w) == type_canonical_form(r) else None


def _to_union(arr: pa.Array, w: AvroType, r: Union, path: str) -> pa.Array:
    """A writer non-union value into reader union ``r``."""
    j = _branch_for(w, r)
    if j is None:
        raise AvroSchemaError(f"{path}: writer type {describe(w)} matches no branch of the "
                              f"reader's union {describe(r)}")
    branch = r.branches[j]
    if is_nullable_union(r):
        if branch.type == "null":
            return pa.nulls(len(arr), arrow_type(r))
        return _resolve(arr, w, branch, path)
    child = _resolve(arr, w, branch, path)
    return dense_union(r, np.full(len(arr), j, np.int8), np.arange(len(arr), dtype=np.int32),
                  {j: child})


def _from_union(arr: pa.Array, w: Union, r: AvroType, path: str) -> pa.Array:
    """A writer union value: each writer branch resolved on its own, then put back together."""
    if is_nullable_union(w):
        return _from_nullable_union(arr, w, r, path)
    # A dense union: resolve every branch's child, then gather rows.
    types = np.asarray(arr.type_codes, dtype=np.int8)
    offsets = np.asarray(arr.offsets, dtype=np.int32)
    if isinstance(r, Union) and not is_nullable_union(r):
        return _dense_into_union(arr, w, r, path, types, offsets)
    return _dense_into_one(arr, w, r, path, types, offsets)


def _from_nullable_union(arr: pa.Array, w: Union, r: AvroType, path: str) -> pa.Array:
    """A writer's ``["null", T]`` (an Arrow column of T with nulls) resolved against ``r``."""
    null_branch = w.branches[w.null_index or 0]
    inner = w.branches[1 - (w.null_index or 0)]
    if not isinstance(r, Union):
        if arr.null_count and r.type != "null":
            _unused(arr.is_null(), path, null_branch, r)
        return _resolve(arr, inner, r, path)
    null_to, inner_to = _branch_for(null_branch, r), _branch_for(inner, r)
    if arr.null_count and null_to is None:
        _unused(arr.is_null(), path, null_branch, r)
    if inner_to is None:
        _unused(arr.is_valid(), path, inner, r)
        return pa.nulls(len(arr), arrow_type(r))
    child = _resolve(arr, inner, r.branches[inner_to], path)
    if is_nullable_union(r):
        return child
    valid = np.asarray(arr.is_valid())
    types = np.where(valid, inner_to, null_to if null_to is not None else 0).astype(np.int8)
    offsets = np.empty(len(arr), np.int32)
    offsets[valid] = np.arange(int(valid.sum()), dtype=np.int32)
    offsets[~valid] = np.arange(int((~valid).sum()), dtype=np.int32)
    children = {inner_to: child.filter(pa.array(valid))}
    if null_to is not None:
        children[null_to] = pa.nulls(int((~valid).sum()), arrow_type(r.branches[null_to]))
    return dense_union(r, types, offsets, children)


def _dense_into_union(arr: pa.Array, w: Union, r: Union, path: str, types: Any,
                      offsets: Any) -> pa.Array:
    """A writer's dense union resolved against a reader union: branch by branch, then the rows
    re-pointed at the reader's branches."""
    used = np.bincount(types, minlength=len(w.branches)) > 0
    mapping = np.full(len(w.branches), -1, np.int8)
    pieces: dict[int, list[pa.Array]] = {}
    base = np.zeros(len(w.branches), np.int32)
    for i, branch in enumerate(w.branches):
        j = _branch_for(branch, r)
        if j is None:
            if used[i]:
                _unused(types == i, path, branch, r)
            continue
        mapping[i] = j
        done = pieces.setdefault(j, [])
        base[i] = sum(len(p) for p in done)
        done.append(_resolve(arr.field(i), branch, r.branches[j], path))
    children = {j: pa.concat_arrays(p) for j, p in pieces.items()}
    return dense_union(r, mapping[types], base[types] + offsets, children)


def _dense_into_one(arr: pa.Array, w: Union, r: AvroType, path: str, types: Any,
                    offsets: Any) -> pa.Array:
    """A writer's dense union resolved against one reader type (or a nullable reader union):
    every used branch resolved to it, then the rows gathered in order."""
    used = np.bincount(types, minlength=len(w.branches)) > 0
    target = arrow_type(r)
    resolved: list[pa.Array] = []
    starts = np.zeros(len(w.branches), np.int64)
    for i, branch in enumerate(w.branches):
        child = arr.field(i)
        starts[i] = sum(len(p) for p in resolved)
        if not used[i]:
            resolved.append(pa.nulls(len(child), target))
            continue
        if branch.type == "null":
            goes = r.type == "null" or (isinstance(r, Union) and r.null_index is not None)
            if not goes:
                _unused(types == i, path, branch, r)
            resolved.append(pa.nulls(len(child), target))
            continue
        into = r
        if isinstance(r, Union):  # a nullable reader union: the non-null branch
            j = _branch_for(branch, r)
            if j is None or r.branches[j].type == "null":
                _unused(types == i, path, branch, r)
                continue
            into = r.branches[j]
        elif not (_matches(branch, r, True)):
            _unused(types == i, path, branch, r)
        resolved.append(_resolve(child, branch, into, path))
    whole = pa.concat_arrays(resolved) if resolved else pa.nulls(0, target)
    return whole.take(pa.array(starts[types] + offsets))


def _unused(rows: Any, path: str, branch: AvroType, r: AvroType) -> None:
    """Fail if any row selected by ``rows`` holds a writer branch the reader cannot take."""
    hits = np.flatnonzero(np.asarray(rows, dtype=bool))
    if hits.size:
        raise AvroDecodeError(
            f"{path}: value {int(hits[0])} is a {describe(branch)}, which the reader's "
            f"{describe(r)} has no branch for"
        )


def _plain(arr: pa.Array, w: AvroType, r: AvroType, path: str) -> pa.Array:
    """Neither side a union."""
    if not _matches(w, r, promote=True):
        raise AvroSchemaError(
            f"{path}: writer type {describe(w)} cannot be read as {describe(r)}"
        )
    if isinstance(w, Primitive):
        assert isinstance(r, Primitive)
        return _primitive(arr, w, r, path)
    if isinstance(w, Record) and is_recursive(w) and not pa.types.is_struct(arr.type):
        assert isinstance(r, Record)  # below the top: binary
        return _kept(arr, w, r, path)
    if isinstance(w, Record):
        assert isinstance(r, Record)
        return _record(arr, w, r, path)
    if isinstance(w, Enum):
        assert isinstance(r, Enum)
        return _enum(arr, w, r, path)
    if isinstance(w, Fixed):
        assert isinstance(r, Fixed)
        return _same_logical(arr, w, r, path)
    if isinstance(w, Array):
        assert isinstance(r, Array)
        return _list(arr, lambda values: _resolve(values, w.items, r.items, f"{path}[]"), r)
    assert isinstance(w, Map) and isinstance(r, Map)
    return _map(arr, w, r, path)


def _primitive(arr: pa.Array, w: Primitive, r: Primitive, path: str) -> pa.Array:
    target = arrow_type(r)
    if arr.type == target and w.type == r.type:
        return arr
    if not _plain_or_temporal(w) or not _plain_or_temporal(r):
        return _same_logical(arr, w, r, path)
    raw = arr.view(_raw(w.type)) if w.logical_type else arr
    if w.type != r.type:
        try:
            # long -> float may round, as in Avro; bytes -> string checks UTF-8.
            raw = raw.cast(_raw(r.type), safe=r.type == "string")
        except pa.ArrowInvalid as exc:  # bytes that are not UTF-8 read as string
            raise AvroDecodeError(f"{path}: writer bytes are not valid UTF-8 for the "
                                  f"reader's string: {exc}") from None
    return raw.view(target) if r.logical_type else raw


def _raw(kind: str) -> pa.DataType:
    """The Arrow type of a primitive without its logical type."""
    return arrow_type(Primitive(kind))


def _plain_or_temporal(t: Primitive) -> bool:
    return t.logical_type is None or t.logical_type in _TEMPORAL


def _same_logical(arr: pa.Array, w: Primitive | Fixed, r: Primitive | Fixed, path: str) -> Any:
    """Decimal, uuid and duration resolve only to themselves (same parameters)."""
    same = (w.logical_type == r.logical_type and w.precision == r.precision
            and w.scale == r.scale)
    if not same:
        raise AvroSchemaError(f"{path}: writer {describe(w)} cannot be read as {describe(r)} "
                              "(their logical types or decimal parameters differ)")
    target = arrow_type(r)
    return arr if arr.type == target else arr.cast(target)


def _record(arr: pa.Array, w: Record, r: Record, path: str) -> pa.Array:
    by_name = {f.name: i for i, f in enumerate(w.fields)}
    children: list[pa.Array] = []
    for field in r.fields:
        where = f"{path}.{field.name}"
        i = next((by_name[n] for n in (field.name, *field.aliases) if n in by_name), None)
        if i is not None:
            children.append(_resolve(arr.field(i), w.fields[i].type, field.type, where))
        elif field.has_default:
            children.append(default_array(field.default, field.type, len(arr), where))
        else:
            raise AvroSchemaError(f"{where}: the reader's field is not in the writer's "
                                  f"{_short(w.name)} and has no default")
    t = record_struct(r)
    if not children:  # no fields: the length and validity are all there is
        valid = pc.invert(arr.is_null()).buffers()[1] if arr.null_count else None
        return pa.Array.from_buffers(t, len(arr), [valid], arr.null_count, children=[])
    mask = arr.is_null() if arr.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)


def _kept(arr: pa.Array, w: Record, r: Record, path: str) -> pa.Array:
    """Values of a recursive writer record, kept as their encoding (a binary column): the same
    bytes when the reader's record is the same; else decoded and resolved to the reader's schema,
    and encoded again with it when the reader keeps them as bytes too. Each level of nesting where
    the two differ is one more decode, so deep data past Python's recursion limit is refused."""
    same = type_json(w) == type_json(r)
    if same:
        return arr
    valid = arr.drop_null() if arr.null_count else arr
    if not len(valid):  # no values (the recursion ends here)
        return pa.nulls(len(arr), arrow_type(r))
    try:  # decoded with the writer's schema, then resolved here, level by level
        reader = parse_schema(type_json(r))
        writer = pruned(parse_schema(type_json(w)), reader)
        batch = resolve(decode_messages(valid, writer)[0], writer, reader)
        values: pa.Array = (encode(batch, type_json(r)) if is_recursive(r)
                            else batch.to_struct_array())
    except RecursionError:
        raise AvroDecodeError(f"{path}: values of the recursive {_short(w.name)} nest too deep "
                              "to resolve level by level against the reader's schema") from None
    if not arr.null_count:
        return values
    valid_mask = np.asarray(arr.is_valid())
    positions = np.cumsum(valid_mask) - 1
    return values.take(pa.array(positions, pa.int64(), mask=~valid_mask))


def _enum(arr: pa.Array, w: Enum, r: Enum, path: str) -> pa.Array:
    position = {s: j for j, s in enumerate(r.symbols)}
    fallback = position.get(r.default, -1) if r.default is not None else -1
    written = arr.dictionary.to_pylist()  # the writer's symbols (in its schema's order)
    mapping = np.array([position.get(s, fallback) for s in written] or [0], np.int32)
    indices = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
    remapped = mapping[indices]
    bad = np.flatnonzero((remapped < 0) & np.asarray(arr.is_valid()))
    if bad.size:
        symbol = written[indices[bad[0]]]
        raise AvroDecodeError(f"{path}: value {int(bad[0])} is symbol {symbol!r}, which the "
                              f"reader's enum {_short(r.name)} lacks and it has no default")
    mask = np.asarray(arr.is_null()) if arr.null_count else None
    return pa.DictionaryArray.from_arrays(pa.array(remapped, pa.int32(), mask=mask),
                                          pa.array(r.symbols, pa.string()))


def _list(arr: pa.Array, items: Callable[[pa.Array], pa.Array], r: AvroType) -> pa.Array:
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    values = items(arr.values.slice(first, last - first))
    mask = arr.is_null() if arr.null_count else None
    return pa.ListArray.from_arrays(pa.array(offsets - first, pa.int32()), values,
                                    type=arrow_type(r), mask=mask)


def _map(arr: pa.Array, w: Map, r: Map, path: str) -> pa.Array:
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    entries = arr.values.slice(first, last - first)
    items = _resolve(entries.field(1), w.values, r.values, f"{path}{{}}")
    mask = arr.is_null() if arr.null_count else None
    return pa.MapArray.from_arrays(pa.array(offsets - first, pa.int32()), entries.field(0),
                                   items, type=arrow_type(r), mask=mask)
