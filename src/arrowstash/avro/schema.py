"""Avro schemas: parsed once into immutable objects, mapped to Arrow, canonical form, fingerprints.

``parse_schema`` accepts what users hold (a JSON string, a dict, a list for a union, or an already
parsed ``Schema``) and resolves named types, namespaces and aliases once, so the decoder and the
encoder walk plain objects instead of JSON (the type classes live in ``types.py`` and are
re-exported here). Logical types that are unknown or invalid are dropped to their underlying
type, as the specification requires; their attributes stay in ``props``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from arrowstash.avro.defaults import default_problem
from arrowstash.avro.types import (
    Array,
    AvroType,
    Enum,
    Field,
    Fixed,
    Map,
    NamedType,
    Primitive,
    Record,
    Union,
    describe,
    full_json,
)
from arrowstash.errors import AvroSchemaError

__all__ = [
    "MAX_DEPTH",
    "PRIMITIVES",
    "Array",
    "AvroType",
    "Enum",
    "Field",
    "Fixed",
    "Map",
    "NamedType",
    "Primitive",
    "PrunedSchema",
    "Record",
    "Schema",
    "Union",
    "canonical_form",
    "describe",
    "fingerprint",
    "parse_schema",
    "to_arrow_schema",
]

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# A namespace's parts may also hold "$": Java's Avro names the namespace of an inner class's
# schema after the outer class ("com.example.Outer$"), beyond the specification's grammar.
_NAMESPACE_PART = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")
#: How deep types may nest in a schema (each array, map, union, record field or type wrapper is a
#: level; a reference to a named type is not). Every walker of a schema (Arrow mapping, canonical
#: form, resolution, the encoder and the pure-Python decoder) recurses once or twice per level, so
#: this keeps them far inside Python's recursion limit even when called from a deep stack; Arrow's
#: own IPC reader refuses types nested past 64 levels.
MAX_DEPTH = 128


class Schema:
    """An immutable parsed Avro schema: parse once, reuse for every decode and encode.

    ``root`` is the top-level type, ``names`` maps every fullname (and alias) to its named type,
    ``json`` is a normalised JSON text keeping logical types, defaults and aliases (what goes into
    an Object Container File's header and the Arrow schema's ``avro.schema`` metadata).
    """

    __slots__ = ("_arrow", "canonical_form", "fingerprint", "json", "names", "root")

    root: AvroType
    names: Mapping[str, NamedType]
    json: str
    canonical_form: str  # the specification's Parsing Canonical Form
    fingerprint: bytes  # its CRC-64-AVRO (Rabin) fingerprint, 8 bytes little-endian
    _arrow: Any

    def __init__(self, root: AvroType, names: Mapping[str, NamedType]) -> None:
        set_ = object.__setattr__
        set_(self, "root", root)
        set_(self, "names", MappingProxyType(dict(names)))
        set_(self, "json", json.dumps(full_json(root), separators=(",", ":")))
        set_(self, "canonical_form", _canonical(root, set()))
        set_(self, "fingerprint", _rabin(self.canonical_form.encode()).to_bytes(8, "little"))
        set_(self, "_arrow", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Schema objects are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Schema objects are immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> Any:
        return self.json

    def __repr__(self) -> str:
        return f"Schema({self.json})"

    @property
    def arrow_schema(self) -> Any:
        """The ``pyarrow.Schema`` of the batches this schema decodes to."""
        if self._arrow is None:
            from arrowstash.avro.arrow_types import arrow_schema

            object.__setattr__(self, "_arrow", arrow_schema(self.root, self.json))
        return self._arrow


class PrunedSchema(Schema):
    """A writer's schema without the record fields a reader schema never reads: what is decoded
    into Arrow when reading with that reader (``arrowstash.avro.resolve.pruned`` makes it).
    ``skipped`` maps the fullname of each record that lost fields to the writer's whole record,
    so the decoder reads past the dropped fields' bytes; ``writer`` is the whole schema."""

    __slots__ = ("skipped", "writer")

    skipped: Mapping[str, Record]
    writer: Schema

    def __init__(self, root: AvroType, names: Mapping[str, NamedType], writer: Schema,
                 skipped: Mapping[str, Record]) -> None:
        super().__init__(root, names)
        object.__setattr__(self, "writer", writer)
        object.__setattr__(self, "skipped", MappingProxyType(dict(skipped)))

    def _key(self) -> Any:
        return (self.json, self.writer.json)  # the same fields kept of two writers: two plans


SchemaLike = str | bytes | Mapping[str, Any] | list[Any] | Schema


# Schemas parsed lately, by their JSON text, or by the id of the dict or list given along with a
# copy of it: parsing pyruhvro's benchmark schema took 0.37 ms and a 200-field record's 2.1 ms,
# in every call handed a dict or JSON text, where decoding 100 such messages takes 0.03 ms. A
# copy is used only while the object given still equals it (a dict changed in place, or another
# at a freed one's address, is parsed again).
_RECENT: dict[Any, tuple[Any, Schema]] = {}
_RECENT_MAX = 64


def parse_schema(schema: SchemaLike) -> Schema:
    """Parse a JSON string, a dict, a list (a union) or return an already parsed ``Schema``
    (the same one as for the last equal text or unchanged object: see _RECENT)."""
    if isinstance(schema, Schema):
        return schema
    key = schema if isinstance(schema, (str, bytes)) else id(schema)
    hit = _RECENT.get(key)
    if hit is not None and type(hit[0]) is type(schema) and hit[0] == schema:
        return hit[1]
    parsed = _parse(schema)
    try:
        kept = schema if isinstance(schema, (str, bytes)) else copy.deepcopy(schema)
    except Exception:  # a mapping that cannot be copied (a mappingproxy): parsed every time
        return parsed
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.pop(next(iter(_RECENT), None), None)  # the oldest
    _RECENT[key] = (kept, parsed)
    return parsed


def _parse(schema: SchemaLike) -> Schema:
    obj: Any = schema
    if isinstance(schema, (str, bytes)):
        text = schema.decode() if isinstance(schema, bytes) else schema
        try:
            obj = json.loads(text)
        except RecursionError:  # JSON nested past the interpreter's limit, so past ours as well
            raise AvroSchemaError(
                f"invalid Avro schema: types nest deeper than {MAX_DEPTH} levels") from None
        except json.JSONDecodeError as exc:
            if text.strip() in PRIMITIVES:  # a bare name such as int
                obj = text.strip()
            else:
                raise AvroSchemaError(f"schema is not valid JSON: {exc}") from exc
    names: dict[str, NamedType] = {}
    parser = _Parser(names)
    root = parser.parse(obj, "", "$")
    for path, f in parser.defaults:  # once every type is whole, so recursive ones are too
        problem = default_problem(f.default, f.type, MAX_DEPTH)
        if problem is not None:
            raise parser.fail(path, f"bad default for {describe(f.type)}: {problem}")
    return Schema(root, names)


def to_arrow_schema(schema: SchemaLike) -> Any:
    """The ``pyarrow.Schema`` of the batches ``schema`` decodes to (see ``Schema.arrow_schema``):
    a record's fields become the columns, any other type one column named ``value``; the
    metadata's ``avro.schema`` holds ``Schema.json``. Values of a recursive record below the top
    level are kept as their own encoding in ``binary`` columns (see docs/avro.md)."""
    return parse_schema(schema).arrow_schema


def canonical_form(schema: SchemaLike) -> str:
    """The Parsing Canonical Form of ``schema`` (the text fingerprints are computed over)."""
    return parse_schema(schema).canonical_form


def _rabin_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_RABIN_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


_RABIN_EMPTY = 0xC15D213AA4D7A795
_RABIN_TABLE = _rabin_table()


def _rabin(data: bytes) -> int:
    fp = _RABIN_EMPTY
    table = _RABIN_TABLE
    for b in data:
        fp = (fp >> 8) ^ table[(fp ^ b) & 0xFF]
    return fp


def fingerprint(schema: SchemaLike, algorithm: str = "CRC-64-AVRO") -> bytes:
    """Fingerprint of the canonical form: ``"CRC-64-AVRO"`` (8 bytes little-endian, as in
    single-object encoding), ``"MD5"`` or ``"SHA-256"`` (any hashlib name works too)."""
    data = parse_schema(schema).canonical_form.encode()
    if algorithm.upper() in ("CRC-64-AVRO", "RABIN"):
        return _rabin(data).to_bytes(8, "little")
    name = {"MD5": "md5", "SHA-256": "sha256"}.get(algorithm.upper(), algorithm)
    try:
        return hashlib.new(name, data).digest()
    except ValueError as exc:
        raise ValueError(f"unknown fingerprint algorithm {algorithm!r}") from exc


# -- parsing -------------------------------------------------------------------------------------

_KNOWN = {
    "record": {"type", "name", "namespace", "fields", "aliases", "doc"},
    "enum": {"type", "name", "namespace", "symbols", "default", "aliases", "doc"},
    "fixed": {"type", "name", "namespace", "size", "aliases", "doc"},
    "array": {"type", "items"},
    "map": {"type", "values"},
}
_FIELD_KEYS = {"name", "type", "default", "aliases", "doc", "order"}
_LOGICAL_ON = {
    "date": "int",
    "time-millis": "int",
    "time-micros": "long",
    "timestamp-millis": "long",
    "timestamp-micros": "long",
    "timestamp-nanos": "long",
    "local-timestamp-millis": "long",
    "local-timestamp-micros": "long",
    "local-timestamp-nanos": "long",
    "uuid": "string",
}


class _Parser:
    def __init__(self, names: dict[str, NamedType]) -> None:
        self.names = names
        self.depth = 0
        self.defaults: list[tuple[str, Field]] = []  # (path, field) of each field with a default

    def fail(self, path: str, message: str) -> AvroSchemaError:
        return AvroSchemaError(f"invalid Avro schema at {path}: {message}")

    def parse(self, obj: Any, namespace: str, path: str) -> AvroType:
        if self.depth >= MAX_DEPTH:  # also ends a dict that contains itself
            raise self.fail(path, f"types nest deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return self.parse_type(obj, namespace, path)
        finally:
            self.depth -= 1

    def parse_type(self, obj: Any, namespace: str, path: str) -> AvroType:
        if isinstance(obj, str):
            return self.reference(obj, namespace, path)
        if isinstance(obj, list):
            return self.union(obj, namespace, path)
        if not isinstance(obj, Mapping):
            raise self.fail(path, f"expected a type name, object or list, got {obj!r}")
        kind = obj.get("type")
        if isinstance(kind, (list, Mapping)):  # {"type": {...}} or {"type": [...]} wraps a type
            return self.parse(kind, namespace, path)
        if not isinstance(kind, str):
            raise self.fail(path, f"missing or invalid 'type' in {_short(obj)}")
        if kind in PRIMITIVES:
            return self.primitive(kind, obj, path)
        if kind in ("record", "error"):
            return self.record(obj, namespace, path, kind)
        if kind == "enum":
            return self.enum(obj, namespace, path)
        if kind == "fixed":
            return self.fixed(obj, namespace, path)
        if kind == "array":
            if "items" not in obj:
                raise self.fail(path, "array without 'items'")
            return Array(self.parse(obj["items"], namespace, path + ".items"), _props(obj, "array"))
        if kind == "map":
            if "values" not in obj:
                raise self.fail(path, "map without 'values'")
            return Map(self.parse(obj["values"], namespace, path + ".values"), _props(obj, "map"))
        return self.reference(kind, namespace, path)

    def reference(self, name: str, namespace: str, path: str) -> AvroType:
        if name in PRIMITIVES:
            return Primitive(name)
        candidates = [name] if "." in name else [f"{namespace}.{name}" if namespace else name, name]
        for candidate in candidates:
            if candidate in self.names:
                return self.names[candidate]
        raise self.fail(path, f"unknown type {name!r}")

    def union(self, branches: list[Any], namespace: str, path: str) -> Union:
        parsed: list[AvroType] = []
        seen: set[str] = set()
        for i, b in enumerate(branches):
            t = self.parse(b, namespace, f"{path}[{i}]")
            if isinstance(t, Union):
                raise self.fail(path, "a union may not immediately contain another union")
            key = t.name if isinstance(t, (Record, Enum, Fixed)) else t.type
            if key in seen:
                raise self.fail(path, f"union contains {key!r} more than once")
            seen.add(key)
            parsed.append(t)
        return Union(tuple(parsed))

    def primitive(self, kind: str, obj: Mapping[str, Any], path: str) -> Primitive:
        props = {k: v for k, v in obj.items() if k != "type"}
        logical = obj.get("logicalType")
        if logical == "decimal" and kind == "bytes":
            ps = _decimal_params(obj, None)
            if ps is not None:
                return Primitive(kind, "decimal", ps[0], ps[1], _without(props, _DECIMAL_KEYS))
        elif isinstance(logical, str) and _LOGICAL_ON.get(logical) == kind:
            return Primitive(kind, logical, props=_without(props, {"logicalType"}))
        return Primitive(kind, props=MappingProxyType(props))

    def define(self, obj: Mapping[str, Any], namespace: str, path: str) -> tuple[str, str]:
        """The fullname of a named type and the namespace its children inherit."""
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise self.fail(path, f"named type without a valid 'name' in {_short(obj)}")
        if "." in name:
            fullname = name
        else:
            ns = obj.get("namespace", namespace)
            if ns is not None and not isinstance(ns, str):
                raise self.fail(path, f"invalid namespace {ns!r}")
            fullname = f"{ns}.{name}" if ns else name
        parts = fullname.split(".")
        if not _NAME.match(parts[-1]) or not all(_NAMESPACE_PART.match(p) for p in parts[:-1]):
            raise self.fail(path, f"invalid name {fullname!r}")
        if parts[-1] in PRIMITIVES and len(parts) == 1:
            raise self.fail(path, f"{fullname!r} redefines a primitive type")
        if fullname in self.names:
            raise self.fail(path, f"type {fullname!r} is defined twice")
        return fullname, fullname.rpartition(".")[0]

    def aliases(self, obj: Mapping[str, Any], namespace: str, path: str) -> tuple[str, ...]:
        raw = obj.get("aliases", [])
        if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
            raise self.fail(path, f"'aliases' must be a list of names, got {raw!r}")
        return tuple(a if "." in a or not namespace else f"{namespace}.{a}" for a in raw)

    def register(self, t: NamedType) -> None:
        self.names[t.name] = t
        for alias in t.aliases:
            self.names.setdefault(alias, t)

    def record(self, obj: Mapping[str, Any], namespace: str, path: str, kind: str) -> Record:
        fullname, inner = self.define(obj, namespace, path)
        path = f"{path}<{fullname}>" if path == "$" else path
        raw_fields = obj.get("fields")
        if not isinstance(raw_fields, list):
            raise self.fail(path, f"record {fullname!r} needs a 'fields' list")
        record = Record(
            fullname,
            aliases=self.aliases(obj, inner, path),
            doc=obj.get("doc"),
            props=_props(obj, "record"),
            type="error" if kind == "error" else "record",
        )
        self.register(record)  # before the fields, so they may refer to the record itself
        fields: list[Field] = []
        seen: set[str] = set()
        for i, f in enumerate(raw_fields):
            fpath = f"{path}.fields[{i}]"
            if not isinstance(f, Mapping) or not isinstance(f.get("name"), str):
                raise self.fail(fpath, f"a field needs a 'name': {_short(f)}")
            fname = f["name"]
            fpath = f"{path}.{fname}"
            if not _NAME.match(fname):
                raise self.fail(fpath, f"invalid field name {fname!r}")
            if fname in seen:
                raise self.fail(fpath, f"field {fname!r} appears twice in {fullname!r}")
            seen.add(fname)
            if "type" not in f:
                raise self.fail(fpath, "field without 'type'")
            order = f.get("order", "ascending")
            if order not in ("ascending", "descending", "ignore"):
                raise self.fail(fpath, f"invalid order {order!r}")
            faliases = f.get("aliases", [])
            if not isinstance(faliases, list):
                raise self.fail(fpath, "'aliases' must be a list")
            field = Field(
                fname, self.parse(f["type"], inner, fpath), has_default="default" in f,
                default=f.get("default"), aliases=tuple(faliases), doc=f.get("doc"), order=order,
                props=MappingProxyType({k: v for k, v in f.items() if k not in _FIELD_KEYS}),
            )
            fields.append(field)
            if field.has_default:
                self.defaults.append((fpath, field))
        object.__setattr__(record, "fields", tuple(fields))
        return record

    def enum(self, obj: Mapping[str, Any], namespace: str, path: str) -> Enum:
        fullname, inner = self.define(obj, namespace, path)
        symbols = obj.get("symbols")
        if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
            raise self.fail(path, f"enum {fullname!r} needs a 'symbols' list of strings")
        bad = [s for s in symbols if not _NAME.match(s)]
        if bad:
            raise self.fail(path, f"enum {fullname!r} has invalid symbols {bad!r}")
        if len(set(symbols)) != len(symbols):
            raise self.fail(path, f"enum {fullname!r} has duplicate symbols")
        default = obj.get("default")
        if default is not None and default not in symbols:
            raise self.fail(path, f"enum default {default!r} is not a symbol of {fullname!r}")
        enum = Enum(
            fullname,
            tuple(symbols),
            default,
            self.aliases(obj, inner, path),
            obj.get("doc"),
            _props(obj, "enum"),
        )
        self.register(enum)
        return enum

    def fixed(self, obj: Mapping[str, Any], namespace: str, path: str) -> Fixed:
        fullname, inner = self.define(obj, namespace, path)
        size = obj.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise self.fail(path, f"fixed {fullname!r} needs a non-negative integer 'size'")
        aliases = self.aliases(obj, inner, path)
        props = dict(_props(obj, "fixed"))
        logical = obj.get("logicalType")
        kw: dict[str, Any] = {}
        if logical == "decimal":
            ps = _decimal_params(obj, size)
            if ps is not None:
                kw = {"logical_type": "decimal", "precision": ps[0], "scale": ps[1]}
                props = dict(_without(props, _DECIMAL_KEYS))
        elif (logical == "uuid" and size == 16) or (logical == "duration" and size == 12):
            kw = {"logical_type": logical}
            props = dict(_without(props, {"logicalType"}))
        doc = obj.get("doc")
        fixed = Fixed(fullname, size, aliases, doc=doc, props=MappingProxyType(props), **kw)
        self.register(fixed)
        return fixed


_DECIMAL_KEYS = {"logicalType", "precision", "scale"}


def _decimal_params(obj: Mapping[str, Any], size: int | None) -> tuple[int, int] | None:
    """(precision, scale) of a valid decimal, else None (the type falls back to its base)."""
    precision, scale = obj.get("precision"), obj.get("scale", 0)
    if not isinstance(precision, int) or isinstance(precision, bool) or precision < 1:
        return None
    if not isinstance(scale, int) or isinstance(scale, bool) or not 0 <= scale <= precision:
        return None
    if size is not None and (size == 0 or precision > len(str(2 ** (8 * size - 1) - 1)) - 1):
        return None  # more digits than the fixed size can hold
    if precision > 76:
        return None  # beyond decimal256: no Arrow type can hold it
    return precision, scale


def _props(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return MappingProxyType({k: v for k, v in obj.items() if k not in _KNOWN[kind]})


def _without(props: Mapping[str, Any], keys: set[str]) -> Mapping[str, Any]:
    return MappingProxyType({k: v for k, v in props.items() if k not in keys})


def _short(obj: Any) -> str:
    text = json.dumps(obj, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# -- writing back: the Parsing Canonical Form (the normalised JSON is types.py's full_json) -------


def type_canonical_form(t: AvroType) -> str:
    """The Parsing Canonical Form of one type of a parsed schema (canonical_form's, for a part:
    a named type inside it is written out in full the first time)."""
    return _canonical(t, set())


def _canonical(t: AvroType, seen: set[str]) -> str:
    """Parsing Canonical Form: fullnames, only parsing attributes in fixed order, no spaces."""
    dumps = json.dumps  # ensure_ascii=False keeps non-ASCII characters themselves ([STRINGS])
    if isinstance(t, Primitive):
        return dumps(t.type)
    if isinstance(t, Union):
        return "[" + ",".join(_canonical(b, seen) for b in t.branches) + "]"
    if isinstance(t, Array):
        return '{"type":"array","items":' + _canonical(t.items, seen) + "}"
    if isinstance(t, Map):
        return '{"type":"map","values":' + _canonical(t.values, seen) + "}"
    if t.name in seen:
        return dumps(t.name, ensure_ascii=False)
    seen.add(t.name)
    head = '{"name":' + dumps(t.name, ensure_ascii=False) + ',"type":' + dumps(t.type)
    if isinstance(t, Record):
        fields = ",".join(
            '{"name":' + dumps(f.name, ensure_ascii=False) + ',"type":' + _canonical(f.type, seen)
            + "}"
            for f in t.fields
        )
        return head + ',"fields":[' + fields + "]}"
    if isinstance(t, Enum):
        return head + ',"symbols":' + dumps(list(t.symbols), separators=(",", ":")) + "}"
    return head + ',"size":' + str(t.size) + "}"
