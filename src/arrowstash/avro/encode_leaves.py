"""Compiling the leaf types of an encode plan (primitives with their logical types, enums,
fixed): which Arrow input types each accepts and how they are brought to its layout."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowstash.avro.arrow_types import arrow_type
from arrowstash.avro.encode_nodes import (
    K_BINARY,
    K_BOOL,
    K_DECIMAL_BYTES,
    K_DECIMAL_FIXED,
    K_DOUBLE,
    K_DURATION,
    K_ENUM,
    K_ENUM_STRING,
    K_FIXED,
    K_FLOAT,
    K_INT32,
    K_INT64,
    K_INT64_AS_INT,
    K_LARGE_BINARY,
    K_UUID_STRING,
    Node,
    Normalize,
    PlanError,
    cast_to,
    is_text,
    is_uuid,
    same,
    unfit,
)
from arrowstash.avro.types import Enum, Fixed, Primitive


def primitive(t: Primitive, at: Any, path: str) -> tuple[Node, Normalize]:
    lt, kind = t.logical_type, t.type
    if lt is None:
        return _plain(t, at, path)
    if lt == "decimal":
        return _decimal(t, at, path, K_DECIMAL_BYTES, 0)
    if lt == "uuid":
        if is_uuid(at) or at == pa.binary(16):
            return Node(K_UUID_STRING, path, t, pa.binary(16)), _uuid_storage
        if pa.types.is_string(at) or pa.types.is_large_string(at) or pa.types.is_string_view(at):
            return Node(K_BINARY, path, t, pa.string()), _uuid_text(path)
        raise unfit(path, t, at)
    want = arrow_type(t)
    if lt == "date":
        if at == pa.date32():
            return Node(K_INT32, path, t, want), same
        if at == pa.date64():
            return Node(K_INT32, path, t, want), cast_to(want)
        raise unfit(path, t, at)
    if lt in ("time-millis", "time-micros"):
        if not (pa.types.is_time32(at) or pa.types.is_time64(at)):
            raise unfit(path, t, at)
        k = K_INT32 if kind == "int" else K_INT64
        return Node(k, path, t, want), (same if at == want else cast_to(want))
    # timestamp-* and local-timestamp-*
    if not pa.types.is_timestamp(at):
        raise unfit(path, t, at)
    local = lt.startswith("local-")
    norm = _timestamp(want, at, local)
    return Node(K_INT64, path, t, want), norm


def _timestamp(want: Any, at: Any, local: bool) -> Normalize:
    if local and at.tz is not None:
        def to_wall(arr: Any) -> Any:
            return pc.local_timestamp(arr).cast(want)

        return to_wall
    # naive -> UTC keeps the stored value; another zone keeps the instant; another unit is a
    # checked cast (a value that would lose precision or overflow raises)
    return same if at == want else cast_to(want)


def _plain(t: Primitive, at: Any, path: str) -> tuple[Node, Normalize]:
    kind = t.type
    is_int = pa.types.is_integer(at)
    if kind == "boolean" and pa.types.is_boolean(at):
        return Node(K_BOOL, path, t, pa.bool_()), same
    if kind == "int" and is_int:
        if at == pa.int32():
            return Node(K_INT32, path, t, at), same
        if at.bit_width < 32 or at == pa.uint16():
            return Node(K_INT32, path, t, pa.int32()), cast_to(pa.int32())
        norm = same if at == pa.int64() else cast_to(pa.int64())
        return Node(K_INT64_AS_INT, path, t, pa.int64()), norm
    if kind == "long" and is_int:
        return Node(K_INT64, path, t, pa.int64()), same if at == pa.int64() else cast_to(pa.int64())
    if kind in ("float", "double") and (pa.types.is_floating(at) or is_int):
        want = pa.float32() if kind == "float" else pa.float64()
        k = K_FLOAT if kind == "float" else K_DOUBLE
        if kind == "float" and at == pa.float64():
            return Node(k, path, t, want), _to_float(path)
        return Node(k, path, t, want), same if at == want else cast_to(want)
    if kind == "string":
        if at == pa.string():
            return Node(K_BINARY, path, t, at), same
        if pa.types.is_large_string(at):
            return Node(K_LARGE_BINARY, path, t, at), same
        if pa.types.is_string_view(at) or (
            pa.types.is_dictionary(at) and is_text(at.value_type)
        ):
            return Node(K_BINARY, path, t, pa.string()), cast_to(pa.string())
    if kind == "bytes":
        if at == pa.binary():
            return Node(K_BINARY, path, t, at), same
        if pa.types.is_large_binary(at):
            return Node(K_LARGE_BINARY, path, t, at), same
        if pa.types.is_large_string(at):
            return Node(K_LARGE_BINARY, path, t, pa.large_binary()), cast_to(pa.large_binary())
        if (
            pa.types.is_binary_view(at)
            or pa.types.is_fixed_size_binary(at)
            or is_text(at)
        ):
            return Node(K_BINARY, path, t, pa.binary()), cast_to(pa.binary())
    raise unfit(path, t, at)




def _to_float(path: str) -> Normalize:
    """float64 -> float32, rounding; a finite value past float32's range (which the cast
    turns into an infinity) is refused, as an int out of range is."""
    def norm(arr: Any) -> Any:
        out = arr.cast(pa.float32())
        grown = pc.and_(pc.is_inf(out), pc.invert(pc.is_inf(arr)))
        if pc.any(grown).as_py():
            bad = arr.filter(grown)[0].as_py()
            raise PlanError(path, f"{bad!r} is out of the range of Avro float")
        return out

    return norm


def _uuid_storage(arr: Any) -> Any:
    return arr.storage if isinstance(arr, pa.ExtensionArray) else arr


_UUID_TEXT = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


def _uuid_text(path: str) -> Normalize:
    def norm(arr: Any) -> Any:
        arr = arr.cast(pa.string())
        ok = pc.match_substring_regex(arr, _UUID_TEXT)
        if pc.any(pc.invert(ok)).as_py():
            bad = arr.filter(pc.invert(ok))[0].as_py()
            raise PlanError(path, f"{bad!r} is not a UUID (8-4-4-4-12 hex digits)")
        return pc.utf8_lower(arr)  # the canonical text form is lower case

    return norm


def _decimal(
    t: Primitive | Fixed, at: Any, path: str, kind: int, size: int
) -> tuple[Node, Normalize]:
    if not pa.types.is_decimal(at):
        raise unfit(path, t, at)
    want = arrow_type(t)
    width = 16 if pa.types.is_decimal128(want) else 32
    return Node(kind, path, t, want, p1=size, p2=width), same if at == want else cast_to(want)


def enum_node(t: Enum, at: Any, path: str) -> tuple[Node, Normalize]:
    n = len(t.symbols)
    if pa.types.is_dictionary(at) and is_text(at.value_type):
        return Node(K_ENUM, path, t, pa.int32(), p1=n, symbols=t.symbols), _enum_indices(t, path)
    if at == pa.string():
        return Node(K_ENUM_STRING, path, t, at, p1=n, symbols=t.symbols), same
    if is_text(at):
        node = Node(K_ENUM_STRING, path, t, pa.string(), p1=n, symbols=t.symbols)
        return node, cast_to(pa.string())
    raise unfit(path, t, at)


def _enum_indices(t: Enum, path: str) -> Normalize:
    where = {s: i for i, s in enumerate(t.symbols)}

    def norm(arr: Any) -> Any:
        values = arr.dictionary.to_pylist()
        indices = arr.indices
        if values == list(t.symbols[: len(values)]):
            return indices if indices.type == pa.int32() else indices.cast(pa.int32())
        remap = pa.array([where.get(v, -1) if v is not None else None for v in values], pa.int32())
        out = remap.take(indices)
        if out.null_count < len(out) and pc.min(out).as_py() == -1:
            bad = values[indices[pc.index(out, -1).as_py()].as_py()]
            raise PlanError(path, f"{bad!r} is not a symbol of enum {t.name} {list(t.symbols)}")
        return out

    return norm


def fixed_node(t: Fixed, at: Any, path: str) -> tuple[Node, Normalize]:
    if t.logical_type == "decimal":
        return _decimal(t, at, path, K_DECIMAL_FIXED, t.size)
    if t.logical_type == "duration":
        if at == pa.month_day_nano_interval():
            return Node(K_DURATION, path, t, at), same
        raise unfit(path, t, at)
    want = pa.binary(t.size)
    if t.logical_type == "uuid" and is_uuid(at):
        return Node(K_FIXED, path, t, want, p1=t.size), _uuid_storage
    if at == want:
        return Node(K_FIXED, path, t, want, p1=t.size), same
    if pa.types.is_binary(at) or pa.types.is_large_binary(at) or pa.types.is_binary_view(at):
        def norm(arr: Any) -> Any:
            try:
                return arr.cast(pa.binary()).cast(want)
            except pa.ArrowInvalid as exc:
                message = f"a value is not {t.size} bytes long (fixed {t.name})"
                raise PlanError(path, message) from exc

        return Node(K_FIXED, path, t, want, p1=t.size), norm
    raise unfit(path, t, at)

