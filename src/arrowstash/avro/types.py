"""The parsed Avro types: immutable objects the parser builds once, so the decoder, encoder and
resolution walk plain objects instead of JSON. Re-exported by ``arrowstash.avro.schema``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["Array", "AvroType", "Enum", "Field", "Fixed", "Map", "NamedType", "Primitive",
           "Record", "Union", "describe", "full_json"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, eq=False, repr=False)
class _Base:
    """Common attributes; ``props`` holds attributes the parser did not interpret."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({describe(self)})"  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False, repr=False)
class _Named(_Base):
    """Records, enums and fixed types: ``name`` is the fullname."""

    name: str

    @property
    def namespace(self) -> str:
        return self.name.rpartition(".")[0]


@dataclass(frozen=True, eq=False, repr=False)
class Primitive(_Base):
    """null, boolean, int, long, float, double, bytes or string, maybe with a logical type."""

    type: str
    logical_type: str | None = None
    precision: int | None = None  # decimal only
    scale: int | None = None  # decimal only
    props: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, eq=False, repr=False)
class Field:
    """A record field; ``has_default`` tells a JSON ``null`` default from no default."""

    name: str
    type: AvroType
    has_default: bool = False
    default: Any = None
    aliases: tuple[str, ...] = ()
    doc: str | None = None
    order: str = "ascending"
    props: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {describe(self.type)})"


@dataclass(frozen=True, eq=False, repr=False)
class Record(_Named):
    """A record (or an ``error``); ``name`` is the fullname, ``aliases`` are fullnames too."""

    fields: tuple[Field, ...] = ()  # set once after construction, so a record can refer to itself
    aliases: tuple[str, ...] = ()
    doc: str | None = None
    props: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    type: str = "record"


@dataclass(frozen=True, eq=False, repr=False)
class Enum(_Named):
    symbols: tuple[str, ...]
    default: str | None = None
    aliases: tuple[str, ...] = ()
    doc: str | None = None
    props: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    type: str = field(default="enum", init=False)


@dataclass(frozen=True, eq=False, repr=False)
class Fixed(_Named):
    size: int
    aliases: tuple[str, ...] = ()
    logical_type: str | None = None
    precision: int | None = None
    scale: int | None = None
    doc: str | None = None
    props: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    type: str = field(default="fixed", init=False)


@dataclass(frozen=True, eq=False, repr=False)
class Array(_Base):
    items: AvroType
    props: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    type: str = field(default="array", init=False)


@dataclass(frozen=True, eq=False, repr=False)
class Map(_Base):
    values: AvroType
    props: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    type: str = field(default="map", init=False)


@dataclass(frozen=True, eq=False, repr=False)
class Union(_Base):
    branches: tuple[AvroType, ...]
    type: str = field(default="union", init=False)

    @property
    def null_index(self) -> int | None:
        """Index of the ``null`` branch, or None."""
        for i, branch in enumerate(self.branches):
            if branch.type == "null":
                return i
        return None


AvroType = Primitive | Record | Enum | Fixed | Array | Map | Union
NamedType = Record | Enum | Fixed


def describe(t: AvroType) -> str:
    """A short human name of a type for error messages: its fullname or its type."""
    if isinstance(t, (Record, Enum, Fixed)):
        return t.name
    if isinstance(t, Primitive) and t.logical_type:
        return f"{t.type}/{t.logical_type}"
    if isinstance(t, Union):
        return "[" + ", ".join(describe(b) for b in t.branches) + "]"
    return t.type


def full_json(t: AvroType) -> Any:
    """The JSON value of type ``t`` on its own (every named type it uses defined inside it):
    what ``Schema.json`` writes of a whole schema."""
    return _to_json(t, set(), "")


def _to_json(t: AvroType, seen: set[str], namespace: str) -> Any:
    """Full JSON of a type: fullnames, every attribute kept, each named type defined once."""
    if isinstance(t, Primitive):
        extra: dict[str, Any] = dict(t.props)
        if t.logical_type:
            extra["logicalType"] = t.logical_type
            if t.logical_type == "decimal":
                extra.update(precision=t.precision, scale=t.scale)
        return {"type": t.type, **extra} if extra else t.type
    if isinstance(t, Union):
        return [_to_json(b, seen, namespace) for b in t.branches]
    if isinstance(t, Array):
        return {"type": "array", "items": _to_json(t.items, seen, namespace), **t.props}
    if isinstance(t, Map):
        return {"type": "map", "values": _to_json(t.values, seen, namespace), **t.props}
    if t.name in seen:
        return t.name
    seen.add(t.name)
    out: dict[str, Any] = {"type": t.type, "name": t.name}
    if namespace and not t.namespace:  # a null-namespace name inside a namespace says so
        out["namespace"] = ""
    if t.aliases:
        out["aliases"] = list(t.aliases)
    if t.doc is not None:
        out["doc"] = t.doc
    if isinstance(t, Record):
        out["fields"] = [_field_json(f, seen, t.namespace) for f in t.fields]
    elif isinstance(t, Enum):
        out["symbols"] = list(t.symbols)
        if t.default is not None:
            out["default"] = t.default
    else:
        out["size"] = t.size
        if t.logical_type:
            out["logicalType"] = t.logical_type
            if t.logical_type == "decimal":
                out.update(precision=t.precision, scale=t.scale)
    out.update(t.props)
    return out


def _field_json(f: Field, seen: set[str], namespace: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f.name, "type": _to_json(f.type, seen, namespace)}
    if f.has_default:
        out["default"] = f.default
    if f.aliases:
        out["aliases"] = list(f.aliases)
    if f.doc is not None:
        out["doc"] = f.doc
    if f.order != "ascending":
        out["order"] = f.order
    out.update(f.props)
    return out
