"""Field defaults are checked when the schema is parsed, with the field's path in the error,
rather than when a reader first needs one. Compared with fastavro's parser, which checks some."""

from __future__ import annotations

import json
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstash.avro.default_arrays import default_array
from arrowstash.avro.schema import parse_schema
from arrowstash.errors import AvroSchemaError

ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": "string", "default": "none"}]}
FIXED = {"type": "fixed", "name": "F", "size": 2}
DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 3, "scale": 1}


def _record(field_type: Any, default: Any) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": [
        {"name": "f", "type": field_type, "default": default}]}


VALID = [
    ("null", None), ("boolean", False), ("int", -(2**31)), ("long", 2**63 - 1),
    ("float", 1.5), ("float", 3), ("double", -1e300), ("bytes", "\u00ff\u0000"),
    ("string", "é"), (FIXED, "ab"), (DECIMAL, "\u0003\u00e7"),  # 999: three digits
    ({"type": "string", "logicalType": "uuid"}, "0f8fad5b-d9cb-469f-a165-70867728950e"),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, "B"),
    ({"type": "array", "items": "int"}, [1, 2]),
    ({"type": "map", "values": ["null", "long"]}, {"a": None}),
    (ADDRESS, {"city": "Oslo"}),  # zip has a default of its own
    (["null", "string"], None),
    (["null", "string"], "x"),  # Avro 1.12: the first branch the default fits
    (["int", ADDRESS], {"city": "Rome", "zip": "00100"}),
]


@pytest.mark.parametrize(("field_type", "default"), VALID)
def test_defaults_that_fit_their_type_parse(field_type: Any, default: Any) -> None:
    schema = parse_schema(_record(field_type, default))
    field = schema.root.fields[0]  # type: ignore[union-attr]
    assert field.has_default and field.default == default
    fastavro.parse_schema(_record(field_type, default))  # the peer takes them too
    assert len(default_array(default, field.type, 2, "f")) == 2  # and a reader can build them


# (type, default, what the error says, whether fastavro's parser refuses it as well: None when
# it raises something else)
INVALID = [
    ("int", "seven", r'expected an integer, got "seven"', True),
    ("long", 1.5, r"expected an integer, got 1.5", True),
    ("int", True, r"expected an integer, got true", False),
    ("int", 2**31, r"2147483648 is out of range for int", False),
    ("long", -(2**63) - 1, r"out of range for long", False),
    ("float", 1e300, r"out of range for float", False),
    ("double", 10**400, r"out of range for double", None),  # fastavro: OverflowError
    ("string", None, r"expected a string, got null", True),
    ("null", 0, r"expected null, got 0", True),
    ("boolean", "true", r"expected true or false", True),
    ("bytes", "\u0100", r"code points 0-255", False),
    (FIXED, "abc", r'"abc" holds 3 bytes, not 2', False),
    (DECIMAL, "\u0003\u00e8", r"holds 4 digits, more than precision 3", False),
    ({"type": "string", "logicalType": "uuid"}, "nope", r'"nope" is not a UUID', False),
    ({"type": "enum", "name": "E", "symbols": ["A"]}, "B", r'"B" is not a symbol of E', False),
    ({"type": "array", "items": "int"}, [1, "x"], r'\[1\]: expected an integer, got "x"', False),
    ({"type": "map", "values": "long"}, [], r"expected an object, got \[\]", True),
    ({"type": "map", "values": "long"}, {"k": "v"}, r'\["k"\]: expected an integer', False),
    (ADDRESS, {"zip": "1"}, r"lacks field 'city' of Address, which has no default", False),
    (ADDRESS, {"city": 5}, r"\.city: expected a string, got 5", False),
    (["null", "string"], 3, r"3 fits no branch of \[null, string\]", True),
    (["null", ADDRESS], {"city": 5},
     r"fits no branch of \[null, Address\] \(as Address: \.city: expected a string", False),
]


@pytest.mark.parametrize(("field_type", "default", "message", "fastavro_refuses"), INVALID)
def test_a_bad_default_is_refused_when_parsed_naming_the_field(
    field_type: Any, default: Any, message: str, fastavro_refuses: bool | None
) -> None:
    with pytest.raises(AvroSchemaError, match=r"at \$<R>\.f: bad default for .*" + message):
        parse_schema(_record(field_type, default))
    with pytest.raises(AvroSchemaError, match=message):  # JSON text too: the same check
        parse_schema(json.dumps(_record(field_type, default)))
    if fastavro_refuses:
        with pytest.raises(fastavro.schema.SchemaParseException):
            fastavro.parse_schema(_record(field_type, default))
    elif fastavro_refuses is False:  # fastavro is laxer here: our check is our own, not a copy
        fastavro.parse_schema(_record(field_type, default))


def test_the_path_reaches_a_nested_records_field() -> None:
    inner = {"type": "record", "name": "A", "fields": [
        {"name": "city", "type": "string", "default": 5}]}
    schema = {"type": "record", "name": "R", "fields": [{"name": "address", "type": inner}]}
    with pytest.raises(AvroSchemaError, match=r"at \$<R>\.address\.city: bad default for string"):
        parse_schema(schema)


def test_recursive_types_take_defaults_checked_once_they_are_whole() -> None:
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "long"},
        {"name": "next", "type": ["null", "Node"], "default": None},
        {"name": "first", "type": ["null", "Node"], "default": None}]}
    parse_schema(node)
    ok = {**node, "fields": [*node["fields"][:2], {
        "name": "first", "type": ["Node", "null"], "default": {"value": 1, "next": {"value": 2}}}]}
    parse_schema(ok)  # Node's fields are known by the time the default is checked
    bad = {**node, "fields": [*node["fields"][:2], {
        "name": "first", "type": ["Node", "null"], "default": {"value": 1, "next": {"x": 2}}}]}
    with pytest.raises(AvroSchemaError, match=r"\$<Node>\.first: .*lacks field 'value' of Node"):
        parse_schema(bad)
    deep: Any = None
    for _ in range(300):  # finite, but deeper than any schema may nest: refused, no RecursionError
        deep = {"value": 1, "next": deep}
    too_deep = {**node, "fields": [*node["fields"][:2],
                                   {"name": "first", "type": "Node", "default": deep}]}
    with pytest.raises(AvroSchemaError, match=r"\$<Node>\.first: .*nests deeper"):
        parse_schema(too_deep)


def test_an_enum_default_must_be_one_of_its_symbols() -> None:
    parse_schema({"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "A"})
    with pytest.raises(AvroSchemaError, match="enum default 'C' is not a symbol of 'E'"):
        parse_schema({"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "C"})


TYPES = ["null", "boolean", "int", "long", "float", "double", "bytes", "string", FIXED, DECIMAL,
         {"type": "enum", "name": "E", "symbols": ["A", "B"]},
         {"type": "array", "items": ["null", "int"]}, {"type": "map", "values": "string"},
         ADDRESS, ["null", "double"], ["string", {"type": "array", "items": "long"}]]
LEAVES = (st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False)
          | st.sampled_from(["", "A", "ab", "é", "\u0100", "Oslo"]))
JSON = LEAVES | st.recursive(  # leaves on their own too: st.recursive mostly draws containers
    LEAVES,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["city", "zip", "k"]), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.parametrize("field_type", TYPES)
@settings(max_examples=100, deadline=None)
@given(default=JSON)
def test_every_default_that_parses_can_be_read(field_type: Any, default: Any) -> None:
    """What the parser accepts, the reader's default builder builds: no late failure left."""
    try:
        schema = parse_schema(_record(field_type, default))
    except AvroSchemaError:
        return
    field = schema.root.fields[0]  # type: ignore[union-attr]
    assert len(default_array(default, field.type, 1, "f")) == 1


@pytest.mark.parametrize(("field_type", "default"), [("float", 2**24 + 1), ("double", 2**53 + 1)])
def test_a_large_integer_default_of_a_float_is_read(field_type: str, default: int) -> None:
    schema = parse_schema(_record(field_type, default))  # a JSON number: a valid default
    field = schema.root.fields[0]  # type: ignore[union-attr]
    arrow_type = pa.float32() if field_type == "float" else pa.float64()
    expected = pa.array([float(default)], arrow_type).to_pylist()  # rounded to the type
    assert default_array(default, field.type, 1, "f").to_pylist() == expected
