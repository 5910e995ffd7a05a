"""Record fields' defaults checked against their types when a schema is parsed.

A default is only read when a reader lacks a field (resolution, or a column missing when
encoding), so a wrong one would otherwise surface late, far from the schema that holds it. The
rules are the specification's table: a union's default is read as the first branch it fits
(Avro 1.12; earlier versions asked for the first branch), bytes and fixed are JSON strings of code
points 0-255, a record's default gives every field that has no default of its own. Beyond the
table, what our readers would refuse later is refused now: ints and longs out of range, a float or
double beyond its range, a decimal with more digits than its precision, a uuid that is no UUID.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Mapping
from typing import Any

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

__all__ = ["default_problem"]

_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_FLOAT_MAX = {"float": 3.4028234663852886e38, "double": sys.float_info.max}  # largest finite

#: Where in the default the problem is ("" for the value itself, ".city", "[2]") and what it is.
Problem = tuple[str, str]


def default_problem(value: Any, t: AvroType, max_depth: int) -> str | None:
    """What makes the JSON ``value`` no default of type ``t``, or None when it fits."""
    found = _problem(value, t, max_depth)
    if found is None:
        return None
    where, what = found
    return f"{where}: {what}" if where else what


def _problem(value: Any, t: AvroType, depth: int) -> Problem | None:
    if depth <= 0:
        return "", f"the value nests deeper than the schema allows ({describe(t)})"
    if isinstance(t, Union):
        return _union(value, t, depth)
    if isinstance(t, Record):
        return _record(value, t, depth)
    if isinstance(t, Array):
        if not isinstance(value, (list, tuple)):
            return "", f"expected an array, got {_short(value)}"
        return _first((f"[{i}]", _problem(v, t.items, depth - 1)) for i, v in enumerate(value))
    if isinstance(t, Map):
        if not isinstance(value, Mapping):
            return "", f"expected an object, got {_short(value)}"
        return _first((f"[{json.dumps(k)}]", _problem(v, t.values, depth - 1))
                      for k, v in value.items())
    if isinstance(t, Enum):
        if not isinstance(value, str) or value not in t.symbols:
            return "", f"{_short(value)} is not a symbol of {t.name}"
        return None
    return _leaf(value, t)


def _first(found: Any) -> Problem | None:
    """The first problem of a container's items, its location prefixed by the item's."""
    for where, problem in found:
        if problem is not None:
            return where + problem[0], problem[1]
    return None


def _union(value: Any, t: Union, depth: int) -> Problem | None:
    misses = []
    for branch in t.branches:
        problem = _problem(value, branch, depth - 1)
        if problem is None:
            return None
        misses.append(problem)
    what = f"{_short(value)} fits no branch of {describe(t)}"
    shapes: Any = (Record, Map) if isinstance(value, Mapping) else ()
    if isinstance(value, (list, tuple)):
        shapes = Array
    for branch, (where, why) in zip(t.branches, misses, strict=True):
        if isinstance(branch, shapes):  # a branch of the value's shape: say why it failed
            return "", f"{what} (as {describe(branch)}: {where + ': ' if where else ''}{why})"
    return "", what


def _record(value: Any, t: Record, depth: int) -> Problem | None:
    if not isinstance(value, Mapping):
        return "", f"expected an object for record {t.name}, got {_short(value)}"
    for f in t.fields:
        if f.name in value:
            problem = _problem(value[f.name], f.type, depth - 1)
            if problem is not None:
                return f".{f.name}{problem[0]}", problem[1]
        elif not f.has_default:  # a field's own default is checked where the field is
            return "", f"lacks field {f.name!r} of {t.name}, which has no default"
    return None


def _leaf(value: Any, t: Primitive | Fixed) -> Problem | None:
    kind = t.type
    if kind == "null":
        return None if value is None else ("", f"expected null, got {_short(value)}")
    if kind == "boolean":
        return None if isinstance(value, bool) else ("", f"expected true or false, got "
                                                         f"{_short(value)}")
    if kind in _RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            return "", f"expected an integer, got {_short(value)}"
        low, high = _RANGES[kind]
        return None if low <= value <= high else ("", f"{value} is out of range for {kind}")
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "", f"expected a number, got {_short(value)}"
        if _FLOAT_MAX[kind] < abs(value) < float("inf"):
            return "", f"{value} is out of range for {kind}"
        return None
    if kind == "string":
        if not isinstance(value, str):
            return "", f"expected a string, got {_short(value)}"
        return _uuid(value) if t.logical_type == "uuid" else None
    return _bytes(value, t)


def _uuid(value: str) -> Problem | None:
    try:
        uuid.UUID(value)
    except ValueError:
        return "", f"{_short(value)} is not a UUID"
    return None


def _bytes(value: Any, t: Primitive | Fixed) -> Problem | None:
    """bytes and fixed: a JSON string whose code points 0-255 are the bytes."""
    if not isinstance(value, str) or any(ord(c) > 255 for c in value):
        return "", f"expected a string of code points 0-255 (the bytes), got {_short(value)}"
    if isinstance(t, Fixed) and len(value) != t.size:
        return "", f"{_short(value)} holds {len(value)} bytes, not {t.size}"
    if t.logical_type == "decimal" and t.precision is not None:
        digits = len(str(abs(int.from_bytes(value.encode("latin-1"), "big", signed=True))))
        if digits > t.precision:
            return "", f"{_short(value)} holds {digits} digits, more than precision {t.precision}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."
