"""The encode plan: an Avro schema compiled against the Arrow types of the input.

Both encoders (native ``_native._cencode``, pure-Python ``_python.encoder``) walk the same plan
over the same normalised arrays, so they cannot disagree about what is accepted. Compiling
decides once per call which Arrow input types an Avro type accepts and how each is brought to the
one physical layout its node reads (the Arrow mapping's type, or a few layouts read in place:
large strings, plain strings for an enum, int64 for an int). This module compiles the nested
types (record, array, map, union); ``encode_leaves`` the others; ``encode_nodes`` holds the
plan's parts:

- int: any integer type (int64/uint32/uint64 are range-checked per value); long: any integer
  type; float/double: any float or integer type (cast, float64 -> float32 rounds).
- string: string, large_string, string_view, dictionary of strings; bytes: any binary or string.
- date/time/timestamp: the mapped type, or another unit (cast; a value that would lose precision
  is an error); timestamp-* takes tz-aware timestamps of any zone (the instant is stored) and
  naive ones as UTC; local-timestamp-* takes naive ones, and tz-aware ones as their wall time.
- enum: a dictionary of strings in any order (remapped to the schema's symbols) or plain strings.
- uuid: ``pa.uuid()`` or fixed_size_binary(16); a string uuid also takes 36-character text.
- fixed: fixed_size_binary(size) or binary (every value must have ``size`` bytes).
- decimal: any decimal type (cast to the mapped precision and scale; overflow is an error).
- a recursive record below the top level: binary, large_binary or binary_view holding each
  value's own encoding (what decode gives), checked by decoding it and written unchanged; or a
  struct as for any record.
- record: a struct (fields matched by name, extra fields ignored); array: list, large_list,
  fixed_size_list or list_view; map: a map with string keys.
- union: a dense or sparse union whose children match the branches by type code (in order) or by
  the mapping's child names; or a plain column of one branch's type (nulls go to the null branch).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrowstash.avro.arrow_types import (
    arrow_type,
    is_nullable_union,
    is_recursive,
    type_json,
    union_child_name,
)
from arrowstash.avro.encode_leaves import enum_node, fixed_node, primitive
from arrowstash.avro.encode_nodes import (
    K_ARRAY,
    K_BINARY,
    K_MAP,
    K_NULL,
    K_RAW,
    K_RECORD,
    K_UNION,
    Node,
    Normalize,
    PlanError,
    cast_to,
    is_text,
    is_uuid,
    same,
    unfit,
)
from arrowstash.avro.schema import (
    Array,
    AvroType,
    Enum,
    Field,
    Fixed,
    Map,
    Primitive,
    Record,
    Union,
    describe,
    parse_schema,
)
from arrowstash.avro.writer_decoder import decode_messages
from arrowstash.errors import AvroDecodeError, AvroSchemaError


@dataclass(eq=False)
class Plan:
    root: Node
    normalize_columns: list[tuple[str, Normalize]]  # input column name -> normalise
    arrow_type: Any  # the normalised type of the array root reads
    checked: set[Any] = field(default_factory=set)  # normalised types seen to fit arrow_type
    fields: list[Any] | None = None  # a record's: the fields of the last struct type checked
    #: fields the input has no column for: their default, as a column of a given length
    defaults: dict[str, Callable[[int], Any]] = field(default_factory=dict)
    input_schema: Any = None  # the pa.Schema compiled against
    #: the input batches are read as they are (every column in the layout the encoder reads,
    #: none missing): None, else the columns to select (an empty list: all, in their order)
    passthrough: list[str] | None = None

    def nodes(self) -> list[Node]:
        return self.root.walk()

    @functools.cached_property
    def native(self) -> tuple[Any, ...]:
        """The plan as _cencode reads it."""
        return self.root.as_tuple()


def compile_plan(root: AvroType, input_schema: Any) -> Plan:
    """Compile ``root`` against a ``pa.Schema`` of the batches to encode."""
    if isinstance(root, Record):
        columns: list[tuple[str, Normalize]] = []
        kids, fields = [], []
        names = set(input_schema.names)
        defaults: dict[str, Callable[[int], Any]] = {}
        for f in root.fields:
            if f.name not in names:
                if not f.has_default:
                    raise PlanError(f.name, f"no column {f.name!r} for the field of type "
                                    f"{describe(f.type)}, which has no default (columns: "
                                    f"{', '.join(input_schema.names)})")
                defaults[f.name] = _default(f, f.name)
                at = arrow_type(f.type)
            elif input_schema.get_field_index(f.name) < 0:
                raise PlanError(f.name, "the input has several columns with this name")
            else:
                at = input_schema.field(f.name).type
            node, norm = _compile(f.type, at, f.name)
            kids.append(node)
            fields.append(pa.field(f.name, node.arrow))
            columns.append((f.name, norm))
        top = Node(K_RECORD, "", root, pa.struct(fields), kids)
        plan = Plan(top, columns, top.arrow, defaults=defaults)
    else:
        if input_schema.names == [] or len(input_schema.names) != 1:
            raise PlanError("", f"a {describe(root)} schema encodes one column, the input has "
                            f"{len(input_schema.names)}")
        name = input_schema.names[0]
        node, norm = _compile(root, input_schema.field(0).type, name)
        plan = Plan(node, [(name, norm)], node.arrow)
    for i, n in enumerate(plan.nodes()):
        n.id = i
    plan.input_schema = input_schema
    order = [name for name, _ in plan.normalize_columns]
    if (plan.root.kind == K_RECORD and not plan.defaults
            and all(norm is same for _, norm in plan.normalize_columns)
            and same_layout(pa.struct([input_schema.field(n) for n in order]), plan.arrow_type)):
        plan.passthrough = [] if order == input_schema.names else order
    return plan


# -- compiling one type --------------------------------------------------------------------------

def _default(f: Field, path: str) -> Callable[[int], Any]:
    """Columns of ``f``'s default (checked now against its type), as the spec's defaults are
    encoded: the JSON value read per the field's schema, a union's default in its first branch
    that takes it."""
    from arrowstash.avro.default_arrays import default_array  # numpy (the avro extra): lazily

    try:
        default_array(f.default, f.type, 0, path)
    except AvroSchemaError as exc:
        raise PlanError(path, str(exc)) from None
    return lambda n: default_array(f.default, f.type, n, path)
def _compile(t: AvroType, at: Any, path: str) -> tuple[Node, Normalize]:
    node, norm = _compile_type(t, at, path)
    return node, _guard(norm, path)


def _guard(norm: Normalize, path: str) -> Normalize:
    """pyarrow's refusals (a cast that would overflow or lose data) become PlanErrors of the
    column path, so encode() can find the row and name both."""
    if norm is same:
        return norm

    def guarded(arr: Any) -> Any:
        try:
            return norm(arr)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise PlanError(path, str(exc)) from exc

    return guarded


def _compile_type(t: AvroType, at: Any, path: str) -> tuple[Node, Normalize]:
    if isinstance(at, pa.BaseExtensionType) and not is_uuid(at):
        at = at.storage_type  # a foreign extension type: encode its storage
        return _compile_storage(t, at, path)
    if isinstance(t, Union):
        return _union(t, at, path)
    if pa.types.is_null(at):
        if isinstance(t, Primitive) and t.type == "null":
            return Node(K_NULL, path, t, pa.null()), same
        raise PlanError(path, f"a column of nulls (Arrow null type) cannot be encoded as "
                        f"non-nullable Avro {describe(t)}")
    if isinstance(t, Primitive):
        return primitive(t, at, path)
    if isinstance(t, Enum):
        return enum_node(t, at, path)
    if isinstance(t, Fixed):
        return fixed_node(t, at, path)
    if isinstance(t, Record) and is_recursive(t) and _is_binary(at):
        return _kept(t, at, path)
    if isinstance(t, Record):
        return _record(t, at, path)
    if isinstance(t, Array):
        return _array(t, at, path)
    return _map(t, at, path)


def _compile_storage(t: AvroType, storage: Any, path: str) -> tuple[Node, Normalize]:
    node, norm = _compile(t, storage, path)
    return node, lambda arr: norm(arr.storage)



def _record(t: Record, at: Any, path: str) -> tuple[Node, Normalize]:
    if not pa.types.is_struct(at):
        raise unfit(path, t, at)
    names = [at.field(i).name for i in range(at.num_fields)]
    kids, norms, fields = [], [], []
    positions: list[int | None] = []  # None: a field the struct lacks, filled with its default
    defaults: dict[int, Callable[[int], Any]] = {}
    for f in t.fields:
        sub = f"{path}.{f.name}" if path else f.name
        if f.name not in names:
            if not f.has_default:
                raise PlanError(sub, f"struct has no field {f.name!r} for Avro "
                                f"{describe(f.type)}, which has no default")
            defaults[len(positions)] = _default(f, sub)
            positions.append(None)
            node, norm = _compile(f.type, arrow_type(f.type), sub)
        else:
            i = names.index(f.name)
            positions.append(i)
            node, norm = _compile(f.type, at.field(i).type, sub)
        kids.append(node)
        norms.append(norm)
        fields.append(pa.field(f.name, node.arrow))
    want = pa.struct(fields)
    node = Node(K_RECORD, path, t, want, kids)
    in_place = positions == list(range(at.num_fields))
    if in_place and all(n is same for n in norms):
        return node, same

    def rebuild(arr: Any) -> Any:
        children = [n(arr.field(i) if i is not None else defaults[k](len(arr)))
                    for k, (n, i) in enumerate(zip(norms, positions, strict=True))]
        mask = arr.is_null() if arr.null_count else None
        names = [f.name for f in fields]
        return pa.StructArray.from_arrays(children, names=names, mask=mask)

    return node, rebuild


def _is_binary(at: Any) -> bool:
    return bool(pa.types.is_binary(at) or pa.types.is_large_binary(at)
                or pa.types.is_binary_view(at))


def _kept(t: Record, at: Any, path: str) -> tuple[Node, Normalize]:
    """Values of a recursive record given as their own encoding (as decode keeps them): each
    must decode as one whole value of ``t`` (with the structure below checked as decode checks
    it), and is then written unchanged."""
    schema = type_json(t)
    to_binary = cast_to(pa.binary())

    def check(arr: Any) -> Any:
        arr = arr if arr.type == pa.binary() else to_binary(arr)
        try:
            decode_messages(arr.drop_null() if arr.null_count else arr, parse_schema(schema),
                            threads=1)
        except AvroDecodeError as exc:
            raise PlanError(path, f"the bytes are not one whole Avro {describe(t)}: {exc}") \
                from None
        return arr

    return Node(K_RAW, path, t, pa.binary()), check


def _own_buffers(arr: Any, n: int) -> list[Any]:
    buffers: list[Any] = arr.buffers()
    return buffers[:n]


def _array(t: Array, at: Any, path: str) -> tuple[Node, Normalize]:
    if not (
        pa.types.is_list(at)
        or pa.types.is_large_list(at)
        or pa.types.is_fixed_size_list(at)
        or pa.types.is_list_view(at)
        or pa.types.is_large_list_view(at)
    ):
        raise unfit(path, t, at)
    item, item_norm = _compile(t.items, at.value_type, f"{path}[]")
    want = pa.list_(pa.field("item", item.arrow))
    node = Node(K_ARRAY, path, t, want, [item])
    as_list = pa.list_(at.value_field)
    if pa.types.is_list(at) and item_norm is same:
        return node, same

    def rebuild(arr: Any) -> Any:
        if arr.type != as_list:
            arr = arr.cast(as_list)
        values = item_norm(arr.values)
        # the rebuilt types follow the children's own (nullability of nested fields included)
        return pa.Array.from_buffers(
            pa.list_(values.type), len(arr), _own_buffers(arr, 2), arr.null_count, arr.offset,
            [values],
        )

    return node, rebuild


def _map(t: Map, at: Any, path: str) -> tuple[Node, Normalize]:
    if not pa.types.is_map(at):
        raise unfit(path, t, at)
    if not is_text(at.key_type):
        raise unfit(path, t, at)
    key = Node(K_BINARY, f"{path}{{}}key", Primitive("string"), pa.string())
    key_norm = same if at.key_type == pa.string() else cast_to(pa.string())
    value, value_norm = _compile(t.values, at.item_type, f"{path}{{}}")
    want = arrow_type(t)
    want = pa.map_(want.key_field, pa.field("value", value.arrow, nullable=True))
    node = Node(K_MAP, path, t, want, [key, value])
    if key_norm is same and value_norm is same:
        return node, same

    def rebuild(arr: Any) -> Any:
        keys, items = key_norm(arr.keys), value_norm(arr.items)
        entries = pa.StructArray.from_arrays(
            [keys, items], fields=[want.key_field, pa.field("value", items.type)]
        )
        return pa.Array.from_buffers(
            pa.map_(want.key_field, pa.field("value", items.type)), len(arr),
            _own_buffers(arr, 2), arr.null_count, arr.offset, [entries],
        )

    return node, rebuild


# -- unions --------------------------------------------------------------------------------------


def _union(t: Union, at: Any, path: str) -> tuple[Node, Normalize]:
    null = t.null_index
    if is_nullable_union(t) and not pa.types.is_union(at):
        assert null is not None
        branch = 1 - null
        if pa.types.is_null(at):
            node = Node(K_NULL, path, t, pa.null(), value_branch=null)
            return node, same
        node, norm = _compile(t.branches[branch], at, path)
        node.null_branch, node.value_branch = null, branch
        return node, norm
    if pa.types.is_union(at):
        return _union_of_union(t, at, path)
    # a plain column holding one branch's type: pick the branch whose mapped type it is, else
    # the first branch that takes it
    if pa.types.is_null(at):
        if null is None:
            raise unfit(path, t, at)
        return Node(K_NULL, path, t, pa.null(), value_branch=null), same
    candidates = sorted(
        (i for i, b in enumerate(t.branches) if b.type != "null"),
        key=lambda i: arrow_type(t.branches[i]) != at,
    )
    for i in candidates:
        try:
            node, norm = _compile(t.branches[i], at, path)
        except PlanError:
            continue
        node.null_branch = -1 if null is None else null
        node.value_branch = i
        return node, norm
    raise unfit(path, t, at)


def _union_of_union(t: Union, at: Any, path: str) -> tuple[Node, Normalize]:
    n = len(t.branches)
    names = [union_child_name(b) for b in t.branches]
    codes = list(at.type_codes)
    child_names = [at.field(i).name for i in range(at.num_fields)]
    if at.num_fields != n:
        raise PlanError(path, f"union of {at.num_fields} children for the {n} branches of "
                        f"{describe(t)}")
    if codes == list(range(n)):
        order = list(range(n))  # child k is branch k
    elif sorted(child_names) == sorted(names):
        order = [child_names.index(name) for name in names]
    else:
        raise PlanError(path, f"cannot match the union's children {child_names} (type codes "
                        f"{codes}) to the branches {names}")
    kids, norms, fields = [], [], []
    for branch, pos in enumerate(order):
        sub = f"{path}<{names[branch]}>"
        node, norm = _compile(t.branches[branch], at.field(pos).type, sub)
        kids.append(node)
        norms.append(norm)
        nullable = t.branches[branch].type == "null"
        fields.append(pa.field(names[branch], node.arrow, nullable=nullable))
    sparse = at.mode == "sparse"
    make = pa.sparse_union if sparse else pa.dense_union
    want = make(fields, type_codes=list(range(n)))
    node = Node(K_UNION, path, t, want, kids, p1=int(sparse))
    # code_of[c] = branch of Arrow type code c
    code_of = {codes[pos]: branch for branch, pos in enumerate(order)}
    identity = all(code_of[c] == c for c in codes)
    if identity and all(k is same for k in norms):
        return node, same

    def rebuild(arr: Any) -> Any:
        # rebuilt with offset 0: sparse children come from pyarrow already sliced to the rows
        own = arr.buffers()
        types_buf = own[1].slice(arr.offset, len(arr))
        if not identity:
            table = pa.array([code_of.get(c, -1) for c in range(128)], pa.int8())
            types = pa.Array.from_buffers(pa.int8(), len(arr), [None, types_buf])
            types_buf = table.take(types).buffers()[1]
        children = [norms[b](arr.field(order[b])) for b in range(n)]
        buffers = [None, types_buf]
        if not sparse:
            buffers.append(own[2].slice(4 * arr.offset, 4 * len(arr)))
        actual = make(
            [pa.field(f.name, c.type, f.nullable) for f, c in zip(fields, children, strict=True)],
            type_codes=list(range(n)),
        )
        return pa.Array.from_buffers(actual, len(arr), buffers, 0, 0, children)

    return node, rebuild


def same_layout(a: Any, b: Any) -> bool:
    """Whether two Arrow types have the same physical layout (names and zones aside)."""
    if isinstance(a, pa.BaseExtensionType):
        a = a.storage_type
    if isinstance(b, pa.BaseExtensionType):
        b = b.storage_type
    if a.id != b.id or a.num_fields != b.num_fields:
        return False
    fixed = pa.types.is_fixed_size_binary(a) or pa.types.is_decimal(a)
    if fixed and a.byte_width != b.byte_width:
        return False
    if pa.types.is_union(a) and a.mode != b.mode:
        return False
    return all(same_layout(a.field(i).type, b.field(i).type) for i in range(a.num_fields))
