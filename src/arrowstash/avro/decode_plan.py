"""The decode plan: a schema compiled into a flat list of column nodes, one per Arrow array.

Both decoders (pure Python in ``_decode.py``, C in ``_cdecode``) walk the same plan and fill the
same buffers per node, in Arrow's own layouts; this module turns those buffers into Arrow arrays
(no copy) and formats the decoders' error tuples, so the two paths agree to the byte and the
message.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from arrowstash.avro.arrow_types import (
    arrow_type,
    is_nullable_union,
    kept_as_bytes,
    union_child_name,
)
from arrowstash.avro.schema import (
    Array,
    AvroType,
    Enum,
    Fixed,
    Map,
    Primitive,
    PrunedSchema,
    Record,
    Schema,
    Union,
    describe,
)

__all__ = ["ERRORS", "Node", "Plan", "assemble", "compile_plan", "error_message"]

# Node kinds (the C decoder uses the same numbers).
NULL, BOOL, INT, LONG, FLOAT, DOUBLE, BYTES, STRING = range(8)
FIXED, ENUM, UUID_STR, DEC_BYTES, DEC_FIXED, DURATION, RECORD, ARRAY, MAP, UNION = range(8, 18)
# A value read past and dropped (a writer field the reader schema does not read): ``param`` is
# the kind of its encoding, ``children`` more SKIP nodes (anywhere in the plan: a recursive type
# refers back to itself). Skipping checks the structure (lengths, counts, union indexes), not the
# values.
SKIP = 18
# A value kept as its own encoding (a recursive record below the top level): read past like a
# SKIP node (its one child), and its bytes stored as a binary column's value.
RAW = 19
#: How deep skipped (or kept) values may nest (recursive data could otherwise exhaust the stack).
SKIP_DEPTH = 10_000

# Error codes shared with the C decoder: code -> message template ({what}, {detail}).
ERRORS = {
    1: "truncated: {what} runs past the end of the data",
    2: "varint longer than 64 bits in {what}",
    3: "{detail} is out of range for int",
    4: "union index {detail} out of range for {what}",
    5: "negative length {detail} for {what}",
    6: "invalid UTF-8 in {what}",
    7: "{detail} trailing byte(s) after the datum",
    8: "boolean byte {detail} is not 0 or 1",
    9: "enum index {detail} out of range for {what}",
    10: "invalid uuid text in {what} (expected the 36-character form)",
    11: "decimal value does not fit {what}",
    12: "duration field {detail} exceeds the int32 range",
    13: "block count {detail} of {what} exceeds the bytes left",
    14: "{what} holds more than 2 GiB in one batch",
    15: "message is shorter than the 5-byte Confluent header",
    16: "Confluent magic byte is {detail}, not 0",
    17: "message is null",
    18: "out of memory",
    19: "{detail} is not a time of day ({what})",
    20: "{what} nests deeper than {detail} levels",
    21: "{what} holds more items that take no bytes than the input's size plus the limit of "
        "{detail} allows (ARROWSTASH_AVRO_MAX_EMPTY_ITEMS)",
}
# Exclusive upper bounds of the time-of-day logical types (``param`` of their INT/LONG nodes).
_TIME_BOUNDS = {"time-millis": 86_400_000, "time-micros": 86_400_000_000}


@dataclass(frozen=True)
class Node:
    """One Arrow array of the output. ``param``: fixed size, enum symbol count, decimal width in
    bytes, union branch count; ``size``: the fixed size of a fixed decimal."""

    kind: int
    null_branch: int  # -1, or the index of "null" in a ["null", T] / [T, "null"] union
    param: int
    size: int
    children: tuple[int, ...]
    type: Any  # the Arrow type of the finished array
    path: str
    what: str  # how errors name the value, e.g. "string at address.city"
    min_size: int  # fewest bytes one value takes (bounds block counts against the bytes left)
    symbols: tuple[str, ...] = ()
    precision: int = 0  # decimals: values of more digits are errors, not wrong data


@dataclass(frozen=True)
class Plan:
    schema: Schema
    nodes: tuple[Node, ...]  # nodes[0] is the top-level record (synthesised for other types)

    @functools.cached_property
    def native(self) -> list[tuple[int, int, int, int, int, tuple[int, ...], bytes]]:
        """The plan as plain tuples, the form the C decoder reads; the last item is a decimal's
        bound, 10 ** precision as ``param`` bytes little-endian."""
        return [
            (n.kind, n.null_branch, n.param, n.size, n.min_size, n.children,
             (10**n.precision).to_bytes(n.param, "little") if n.precision else b"")
            for n in self.nodes
        ]


def compile_plan(schema: Schema) -> Plan:
    """The plan of ``schema``; a :class:`PrunedSchema` adds SKIP nodes for the fields it drops."""
    arrow = schema.arrow_schema
    nodes: list[Node | None] = [None]
    root = schema.root
    skips = _Skips(schema.skipped if isinstance(schema, PrunedSchema) else {})
    skips.raw = _Skips({}, label="")
    if isinstance(root, Record):
        children = skips.fields(root, "", nodes)
    else:
        children = (_compile(root, "value", nodes, skips),)
    min_size = sum(_node(nodes, c).min_size for c in children)
    nodes[0] = Node(RECORD, -1, 0, 0, children, pa.struct(list(arrow)), "", "record", min_size)
    return Plan(schema, tuple(n for n in nodes if n is not None))


_SIMPLE = {"null": NULL, "boolean": BOOL, "int": INT, "long": LONG, "float": FLOAT,
           "double": DOUBLE, "bytes": BYTES, "string": STRING}


class _Skips:
    """Which writer fields a pruned record left out, and their SKIP nodes (one per named type,
    so a recursive type's nodes refer back to themselves). ``raw`` makes the SKIP nodes under
    RAW nodes, whose errors do not call the value skipped."""

    def __init__(self, skipped: Mapping[str, Record], label: str = "skipped ") -> None:
        self.skipped = skipped
        self.label = label
        self.named: dict[str, int] = {}
        self.raw: _Skips = self

    def fields(self, t: Record, path: str, nodes: list[Node | None]) -> tuple[int, ...]:
        """The nodes of a record's fields in the writer's order: kept ones decoded, the rest
        skipped."""
        full = self.skipped.get(t.name)
        if full is None:
            return tuple(_compile(f.type, _join(path, f.name), nodes, self) for f in t.fields)
        kept = {f.name: f for f in t.fields}
        return tuple(
            _compile(kept[f.name].type, _join(path, f.name), nodes, self) if f.name in kept
            else self.skip(f.type, _join(path, f.name), nodes)
            for f in full.fields
        )

    def skip(self, t: AvroType, path: str, nodes: list[Node | None]) -> int:
        named = isinstance(t, (Record, Enum, Fixed))
        if named and t.name in self.named:  # type: ignore[union-attr]
            return self.named[t.name]  # type: ignore[union-attr]
        index = len(nodes)
        nodes.append(None)
        if named:
            self.named[t.name] = index  # type: ignore[union-attr]
        size = 0
        children: tuple[int, ...] = ()
        if isinstance(t, Primitive):
            kind = _SIMPLE[t.type]
            size = {FLOAT: 4, DOUBLE: 8}.get(kind, 0)
        elif isinstance(t, Fixed):
            kind, size = FIXED, t.size
        elif isinstance(t, Enum):
            kind = ENUM
        elif isinstance(t, Record):
            kind = RECORD
            children = tuple(self.skip(f.type, _join(path, f.name), nodes) for f in t.fields)
        elif isinstance(t, Array):
            kind, children = ARRAY, (self.skip(t.items, path + "[]", nodes),)
        elif isinstance(t, Map):
            kind, children = MAP, (self.skip(t.values, path + "{}", nodes),)
        else:
            kind = UNION
            children = tuple(self.skip(b, f"{path}<{union_child_name(b)}>", nodes)
                             for b in t.branches)
        if kind == RECORD:  # a child still being compiled (recursion) counts as empty
            min_size = sum(n.min_size for c in children if (n := nodes[c]) is not None)
        elif kind in (NULL, FIXED, FLOAT, DOUBLE):
            min_size = size
        else:
            min_size = 1
        nodes[index] = Node(SKIP, -1, kind, size, children, pa.null(), path,
                            f"{self.label}{describe(t)} at {path}", min_size)
        return index


def _compile(t: AvroType, path: str, nodes: list[Node | None], skips: _Skips) -> int:
    index = len(nodes)
    nodes.append(None)
    null_branch = -1
    if is_nullable_union(t):
        assert isinstance(t, Union)
        null_branch = t.null_index or 0
        what_union = describe(t)
        t = t.branches[1 - null_branch]
    else:
        what_union = ""
    atype = arrow_type(t)
    what = f"{describe(t)} at {path}" if path else describe(t)
    if what_union:
        what = f"{what_union} at {path}"
    children: tuple[int, ...] = ()
    symbols: tuple[str, ...] = ()
    if kept_as_bytes(t) is not None:  # a recursive record: its bytes, read past
        assert isinstance(t, Record)
        kind, param, size, precision = RAW, 0, 0, 0
        children = (skips.raw.skip(t, path, nodes),)
    elif isinstance(t, (Primitive, Fixed, Enum)):
        kind, param, size, symbols, precision = _leaf(t, atype)
    else:
        param = size = precision = 0
        if isinstance(t, Record):
            kind = RECORD
            children = skips.fields(t, path, nodes)
        elif isinstance(t, Array):
            kind = ARRAY
            children = (_compile(t.items, path + "[]", nodes, skips),)
        elif isinstance(t, Map):
            kind = MAP
            key = len(nodes)
            key_what = f"map key at {path}"
            nodes.append(Node(STRING, -1, 0, 0, (), pa.string(), path + "{key}", key_what, 1))
            children = (key, _compile(t.values, path + "{}", nodes, skips))
        else:
            kind, param = UNION, len(t.branches)
            children = tuple(
                _compile(b, f"{path}<{union_child_name(b)}>", nodes, skips) for b in t.branches
            )
    if null_branch >= 0 or kind not in _MIN_SIZES:  # RAW too: a recursion passes a union,
        min_size = 1  # an array or a map, so a finite value takes a byte at least
    elif kind == RECORD:
        min_size = sum(_node(nodes, c).min_size for c in children)
    elif kind in (FIXED, DEC_FIXED):
        min_size = param if kind == FIXED else size
    else:
        min_size = _MIN_SIZES[kind]
    nodes[index] = Node(kind, null_branch, param, size, children, atype, path, what, min_size,
                        symbols, precision)
    return index


def _leaf(t: Primitive | Fixed | Enum, atype: Any) -> tuple[int, int, int, tuple[str, ...], int]:
    """The kind of a leaf node, its parameter, fixed size, enum symbols and decimal precision."""
    if isinstance(t, Enum):
        return ENUM, len(t.symbols), 0, t.symbols, 0
    if isinstance(t, Fixed):
        if t.logical_type == "decimal":
            return DEC_FIXED, atype.byte_width, t.size, (), atype.precision
        return (DURATION if t.logical_type == "duration" else FIXED), t.size, 0, (), 0
    lt = t.logical_type
    if lt == "uuid":
        return UUID_STR, 0, 0, (), 0
    if lt == "decimal":
        return DEC_BYTES, atype.byte_width, 0, (), atype.precision
    return _SIMPLE[t.type], _TIME_BOUNDS.get(lt or "", 0), 0, (), 0


# Bytes the smallest value of a kind takes; kinds not listed (varint-led) take at least one.
_MIN_SIZES = {NULL: 0, FLOAT: 4, DOUBLE: 8, FIXED: 0, DEC_FIXED: 0, DURATION: 12, RECORD: 0}


def _node(nodes: list[Node | None], i: int) -> Node:
    n = nodes[i]
    assert n is not None
    return n


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def error_message(
    plan: Plan, code: int, segment: int, datum: int, offset: int, node: int, detail: int,
    blocks: bool,
) -> str:
    """The text of an AvroDecodeError from a decoder's error tuple."""
    where = (
        f"block {segment}, datum {datum} at byte {offset}" if blocks
        else f"message {segment} at byte {offset}"
    )
    n = plan.nodes[node]
    text = ERRORS[code].format(what=n.what, detail=detail)
    if code in (3, 8, 12):
        text += f" at {n.path}" if n.path else ""
    return f"{where}: {text}"


def assemble(plan: Plan, columns: Sequence[tuple[int, int, list[Any]]]) -> pa.RecordBatch:
    """The record batch from per-node ``(length, null_count, buffers)`` in Arrow's layouts."""
    root = plan.nodes[0]
    arrays = [_array(plan, columns, i) for i in root.children if plan.nodes[i].kind != SKIP]
    if not arrays:  # a record without fields: one row per datum, and no columns
        rows = pa.array([{}] * columns[0][0], pa.struct([]))
        return pa.RecordBatch.from_struct_array(rows).replace_schema_metadata(
            plan.schema.arrow_schema.metadata)
    return pa.RecordBatch.from_arrays(arrays, schema=plan.schema.arrow_schema)


def _buf(b: Any) -> Any:
    return b if b is None or isinstance(b, pa.Buffer) else pa.py_buffer(b)


def _array(plan: Plan, columns: Sequence[tuple[int, int, list[Any]]], i: int) -> pa.Array:
    node = plan.nodes[i]
    length, nulls, raw = columns[i]
    bufs = [_buf(b) for b in raw]
    kind, t = node.kind, node.type
    if kind == NULL:
        return pa.nulls(length)
    children = [_array(plan, columns, c) for c in node.children if plan.nodes[c].kind != SKIP]
    if kind == ENUM:
        indices = pa.Array.from_buffers(pa.int32(), length, bufs, nulls)
        return pa.DictionaryArray.from_arrays(indices, pa.array(node.symbols, pa.string()))
    if kind == MAP:
        entries_type = pa.struct([t.key_field, t.item_field])
        entries = pa.Array.from_buffers(entries_type, len(children[0]), [None], 0,
                                        children=children)
        return pa.Array.from_buffers(t, length, bufs, nulls, children=[entries])
    if isinstance(t, pa.ExtensionType):  # uuid
        storage = pa.Array.from_buffers(t.storage_type, length, bufs, nulls)
        return pa.ExtensionArray.from_storage(t, storage)
    if children:
        return pa.Array.from_buffers(t, length, bufs, nulls, children=children)
    return pa.Array.from_buffers(t, length, bufs, nulls)
