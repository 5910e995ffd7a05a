"""Arrow arrays of Avro defaults: a field's JSON default as a column of its Arrow mapping (a
reader-only field when resolving, a column missing from a table being encoded), and the dense
unions both resolution and defaults build."""

from __future__ import annotations

import decimal
import uuid
from typing import Any

import pyarrow as pa

from arrowstash.avro.arrow_types import arrow_type, is_nullable_union, is_recursive
from arrowstash.avro.numpy_import import numpy as np
from arrowstash.avro.types import (
    Array,
    AvroType,
    Enum,
    Fixed,
    Map,
    Primitive,
    Record,
    Union,
    describe,
)
from arrowstash.errors import AvroSchemaError

__all__ = ["default_array", "dense_union"]


def dense_union(r: Union, types: np.ndarray, offsets: np.ndarray,
                children: dict[int, pa.Array]) -> pa.Array:
    """A dense union of reader type ``r`` from type codes, offsets and some children (the other
    branches get empty children)."""
    t = arrow_type(r)
    arrays = [children[j] if j in children else pa.nulls(0, t.field(j).type)
              for j in range(t.num_fields)]
    buffers = [None, pa.py_buffer(types.astype(np.int8)), pa.py_buffer(offsets.astype(np.int32))]
    return pa.Array.from_buffers(t, len(types), buffers, children=arrays)


def default_array(default: Any, t: AvroType, n: int, path: str) -> pa.Array:
    """``n`` copies of a field's JSON default as an Arrow array of type ``t``'s mapping (a
    reader-only field when resolving; a column missing from a table being encoded)."""
    try:
        one = _one(default, t)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError,
            pa.ArrowException) as exc:
        raise AvroSchemaError(f"{path}: default {default!r} does not fit {describe(t)}: {exc}") \
            from None
    return one.take(pa.array(np.zeros(n, np.int32)))


def _one(value: Any, t: AvroType) -> pa.Array:
    """A one-element array holding the JSON default ``value`` of type ``t``."""
    if isinstance(t, Record) and is_recursive(t):
        # its values are kept as their encoding, which only the encoder (built on this module)
        # could write: a default that needs one is refused
        raise ValueError(f"a default value of the recursive record {t.name} is not supported")
    target = arrow_type(t)
    if isinstance(t, Union):
        branch = next((j for j, b in enumerate(t.branches) if _fits(value, b)), None)
        if branch is None:
            raise ValueError("it fits no branch of the union")
        if is_nullable_union(t):
            chosen = t.branches[branch]
            return pa.nulls(1, target) if chosen.type == "null" else _one(value, chosen)
        return dense_union(t, np.array([branch], np.int8), np.zeros(1, np.int32),
                      {branch: _one(value, t.branches[branch])})
    if isinstance(t, Record):
        children = [
            _one(value.get(f.name, f.default), f.type) for f in t.fields
        ]
        return pa.StructArray.from_arrays(children, fields=list(target))
    if isinstance(t, Enum):
        return pa.DictionaryArray.from_arrays(pa.array([t.symbols.index(value)], pa.int32()),
                                              pa.array(t.symbols, pa.string()))
    if isinstance(t, Array):
        items = [_one(v, t.items) for v in value]
        values = pa.concat_arrays(items) if items else pa.nulls(0, arrow_type(t.items))
        return pa.ListArray.from_arrays(pa.array([0, len(items)], pa.int32()), values,
                                        type=target)
    if isinstance(t, Map):
        keys = pa.array(list(value), pa.string())
        items = [_one(v, t.values) for v in value.values()]
        values = pa.concat_arrays(items) if items else pa.nulls(0, arrow_type(t.values))
        return pa.MapArray.from_arrays(pa.array([0, len(keys)], pa.int32()), keys, values,
                                       type=target)
    return pa.array([_scalar(value, t)], target)


def _fits(value: Any, t: AvroType) -> bool:
    try:
        _one(value, t)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, pa.ArrowException):
        return False
    return True


def _scalar(value: Any, t: Primitive | Fixed) -> Any:
    """A primitive's JSON default as the Python value pyarrow builds its Arrow type from."""
    if t.type == "null":
        if value is not None:
            raise ValueError("a null default must be null")
        return None
    if t.type in ("bytes", "fixed"):
        raw = value.encode("latin-1")  # JSON defaults hold bytes as code points 0-255
        if isinstance(t, Fixed) and len(raw) != t.size:
            raise ValueError(f"{len(raw)} bytes, not {t.size}")
        if t.logical_type == "decimal":
            assert t.scale is not None
            return decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-t.scale)
        if t.logical_type == "duration":
            months, days, millis = (int.from_bytes(raw[k : k + 4], "little") for k in (0, 4, 8))
            return pa.MonthDayNano([months, days, millis * 1_000_000])
        return raw
    if t.logical_type == "uuid":
        return uuid.UUID(value)
    if t.type == "boolean" and not isinstance(value, bool):
        raise TypeError("not a boolean")
    if t.type in ("int", "long") and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError("not an integer")
    if t.type in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("not a number")
        return float(value)  # pyarrow refuses an int past 2**24 (float) or 2**53 (double)
    if t.type == "string" and not isinstance(value, str):
        raise TypeError("not a string")
    return value
