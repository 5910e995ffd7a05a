"""Avro schema parsing, the Arrow mapping, Parsing Canonical Form and fingerprints.

The canonical forms and fingerprints are checked against the specification's own test cases
(Apache Avro's share/test/data/schema-tests.txt, when ../shared/avro is present) and against
fastavro, the reference implementation, over hypothesis-generated schemas.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import fastavro
import fastavro.schema
import pyarrow as pa
import pytest
from hypothesis import given, settings

from _avro_strategies import avro_schemas
from _shared import SHARED_AVRO
from arrowstash import ArrowstashError, AvroSchemaError
from arrowstash.avro import (
    canonical_form,
    decode,
    fingerprint,
    parse_schema,
    read_ocf,
    to_arrow_schema,
    write_ocf,
)
from arrowstash.avro.schema import Enum, Fixed, Primitive, Record, Union

SCHEMA_TESTS = SHARED_AVRO / "apache-avro/share__test__data__schema-tests.txt"


def _spec_cases() -> list[tuple[str, str, int | None]]:
    """(input, canonical, fingerprint) triples of the Avro project's schema-tests.txt."""
    if not SCHEMA_TESTS.exists():
        return []
    text = SCHEMA_TESTS.read_text()
    cases = []
    for block in re.split(r"\n// \d+\n", text)[1:]:
        inp = re.search(r"<<INPUT ([^\n]*)|<<INPUT\n(.*?)\nINPUT", block, re.S)
        canon = re.search(r"<<canonical (.*)", block)
        fp = re.search(r"<<fingerprint (-?\d+)", block)
        assert inp and canon, block
        cases.append(
            (inp.group(1) or inp.group(2), canon.group(1), int(fp.group(1)) if fp else None)
        )
    return cases


SPEC_CASES = _spec_cases()


@pytest.mark.skipif(not SPEC_CASES, reason="../shared/avro (Avro's schema-tests.txt) is absent")
@pytest.mark.parametrize(("text", "canonical", "fp"), SPEC_CASES)
def test_canonical_form_and_fingerprint_match_the_specification(
    text: str, canonical: str, fp: int | None
) -> None:
    if "Avro parser broken" in text:  # "size":015 is not JSON; Java's lenient parser takes it
        with pytest.raises(AvroSchemaError, match="not valid JSON"):
            parse_schema(text)
        return
    assert canonical_form(text) == canonical
    if fp is not None:
        rabin = int.from_bytes(fingerprint(text), "little")
        assert rabin == fp % 2**64  # the file holds Java's signed longs


def test_spec_cases_were_found() -> None:
    if SCHEMA_TESTS.exists():
        assert len(SPEC_CASES) >= 30


# A few of the specification's cases inline, so the rules are checked without ../shared too.
@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ('{"type":"int"}', '"int"'),
        ('{"type":"fixed","name":"foo","size":0x10}'.replace("0x10", "16"),
         '{"name":"foo","type":"fixed","size":16}'),
        ('{"type":"record","name":"foo","namespace":"x.y","doc":"d",'
         '"fields":[{"name":"f","type":{"type":"enum","name":"E","symbols":["A"]},"default":"A"}]}',
         '{"name":"x.y.foo","type":"record","fields":[{"name":"f","type":'
         '{"name":"x.y.E","type":"enum","symbols":["A"]}}]}'),
        ('{"type":"array","items":{"type":"long","logicalType":"timestamp-millis"}}',
         '{"type":"array","items":"long"}'),
        ('["null", {"type":"map","values":"string"}]', '["null",{"type":"map","values":"string"}]'),
        ('{"type":"record","name":"a.b.R","fields":[{"name":"s","type":'
         '{"type":"enum","name":"\\u00e9","namespace":"","symbols":["X"]}}]}', None),
    ],
)
def test_canonical_form_rules(text: str, canonical: str | None) -> None:
    if canonical is None:  # a name that is not ASCII is rejected, like the specification says
        with pytest.raises(AvroSchemaError, match="invalid name"):
            parse_schema(text)
        return
    assert canonical_form(text) == canonical


@pytest.mark.parametrize("algorithm", ["CRC-64-AVRO", "MD5", "SHA-256"])
@settings(max_examples=60, deadline=None)
@given(schema=avro_schemas())
def test_canonical_form_and_fingerprints_match_fastavro(
    schema: dict[str, Any], algorithm: str
) -> None:
    reference = fastavro.schema.to_parsing_canonical_form(schema)
    assert canonical_form(schema) == reference
    assert fingerprint(schema, algorithm).hex() == fastavro.schema.fingerprint(reference, algorithm)


def test_schema_accepts_json_dict_list_name_and_itself() -> None:
    as_dict = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    parsed = parse_schema(json.dumps(as_dict))
    assert parse_schema(as_dict) == parsed
    assert parse_schema(parsed) is parsed
    assert parse_schema(json.dumps(as_dict).encode()) == parsed
    assert isinstance(parse_schema(["null", "string"]).root, Union)
    assert parse_schema("int").root.type == "int"
    assert parse_schema('"int"').root.type == "int"


def test_schema_is_immutable_and_hashable() -> None:
    s = parse_schema({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
    with pytest.raises(AttributeError):
        s.root = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del s.json
    root = s.root
    assert isinstance(root, Record)
    with pytest.raises(AttributeError):
        root.fields = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.names["X"] = root  # type: ignore[index]
    assert {s: 1}[parse_schema(s.json)] == 1
    assert s.fingerprint == fingerprint(s) and len(s.fingerprint) == 8


def test_named_types_namespaces_and_aliases() -> None:
    s = parse_schema(
        {
            "type": "record",
            "name": "Outer",
            "namespace": "com.ex",
            "aliases": ["Old", "other.Older"],
            "fields": [
                {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["R", "G"],
                                       "default": "G"}},
                {"name": "f", "type": {"type": "fixed", "name": "x.Hash", "size": 4}},
                {"name": "g", "type": "Color", "aliases": ["gg"], "default": "R", "doc": "d"},
                {"name": "h", "type": {"type": "fixed", "name": "Inner", "namespace": "",
                                       "size": 1}},
                {"name": "i", "type": "x.Hash"},
                {"name": "j", "type": ["null", "Outer"], "default": None},
            ],
        }
    )
    root = s.root
    assert isinstance(root, Record)
    assert root.name == "com.ex.Outer" and root.namespace == "com.ex"
    assert root.aliases == ("com.ex.Old", "other.Older")
    assert set(s.names) >= {"com.ex.Outer", "com.ex.Old", "other.Older", "com.ex.Color", "x.Hash",
                            "Inner"}
    e, f, g, h, i, j = (fld.type for fld in root.fields)
    assert isinstance(e, Enum) and e.name == "com.ex.Color" and e.default == "G"
    assert g is e and i is f
    assert isinstance(f, Fixed) and f.name == "x.Hash" and f.size == 4
    assert isinstance(h, Fixed) and h.name == "Inner"
    assert isinstance(j, Union) and j.branches[1] is root  # recursion parses
    gf = root.fields[2]
    assert gf.has_default and gf.default == "R" and gf.aliases == ("gg",) and gf.doc == "d"
    assert root.fields[5].has_default and root.fields[5].default is None
    assert not root.fields[0].has_default
    # the normalised JSON parses back to the same schema, defaults and aliases included
    assert parse_schema(s.json) == s
    assert json.loads(s.json)["fields"][2]["default"] == "R"


@pytest.mark.parametrize(
    ("spec", "logical"),
    [
        ({"type": "int", "logicalType": "date"}, "date"),
        ({"type": "long", "logicalType": "timestamp-nanos"}, "timestamp-nanos"),
        ({"type": "string", "logicalType": "uuid"}, "uuid"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}, "decimal"),
        ({"type": "long", "logicalType": "date"}, None),  # date on long: invalid
        ({"type": "int", "logicalType": "mystery"}, None),  # unknown
        ({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 6}, None),
        ({"type": "bytes", "logicalType": "decimal", "precision": 0}, None),
        ({"type": "bytes", "logicalType": "decimal", "precision": 77}, None),
        ({"type": "bytes", "logicalType": "decimal"}, None),
    ],
)
def test_logical_types_and_invalid_ones_falling_back(
    spec: dict[str, Any], logical: str | None
) -> None:
    t = parse_schema(spec).root
    assert isinstance(t, Primitive) and t.type == spec["type"]
    assert t.logical_type == logical
    if logical is None:  # the attributes stay, so nothing is lost when the schema is written out
        assert t.props["logicalType"] == spec["logicalType"]
        assert json.loads(parse_schema(spec).json)["logicalType"] == spec["logicalType"]


@pytest.mark.parametrize(
    ("size", "precision", "valid"), [(4, 9, True), (4, 10, False), (16, 38, True), (16, 39, False),
                                     (32, 76, True), (0, 1, False)]
)
def test_fixed_decimal_precision_must_fit_the_size(size: int, precision: int, valid: bool) -> None:
    t = parse_schema({"type": "fixed", "name": "D", "size": size, "logicalType": "decimal",
                      "precision": precision}).root
    assert isinstance(t, Fixed)
    assert (t.logical_type == "decimal") is valid
    assert (t.scale == 0) is valid


def test_fixed_uuid_and_duration_need_their_sizes() -> None:
    def logical(size: int, name: str) -> str | None:
        t = parse_schema({"type": "fixed", "name": "F", "size": size, "logicalType": name}).root
        assert isinstance(t, Fixed)
        return t.logical_type

    assert logical(16, "uuid") == "uuid" and logical(15, "uuid") is None
    assert logical(12, "duration") == "duration" and logical(16, "duration") is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{not json", "not valid JSON"),
        ("nosuchtype", "not valid JSON"),
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]},
         r"\$<R>\.a: unknown type 'Nope'"),
        ({"type": "record", "name": "R"}, "needs a 'fields' list"),
        ({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"},
                                                   {"name": "a", "type": "int"}]}, "twice"),
        ({"type": "record", "name": "1R", "fields": []}, "invalid name"),
        ({"type": "enum", "name": "E", "symbols": ["A", "A"]}, "duplicate symbols"),
        ({"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}, "not a symbol"),
        ({"type": "enum", "name": "E", "symbols": ["1A"]}, "invalid symbols"),
        ({"type": "fixed", "name": "F", "size": -1}, "non-negative"),
        ({"type": "fixed", "name": "int", "size": 1}, "redefines a primitive"),
        (["int", "int"], "more than once"),
        (["null", ["int"]], "another union"),
        ({"type": "array"}, "without 'items'"),
        ({"type": "map"}, "without 'values'"),
        ({"type": 5}, "missing or invalid 'type'"),
        ([{"type": "fixed", "name": "F", "size": 1}, {"type": "fixed", "name": "F", "size": 2}],
         "defined twice"),
    ],
)
def test_invalid_schemas_raise_avro_schema_error(spec: Any, message: str) -> None:
    with pytest.raises(AvroSchemaError, match=message) as info:
        parse_schema(spec)
    assert isinstance(info.value, ArrowstashError) and isinstance(info.value, ValueError)


def test_arrow_mapping_table() -> None:
    """Every row of the mapping table in AVRO_DESIGN.md / docs/avro.md."""
    fields: list[tuple[Any, Any, bool]] = [
        ("null", pa.null(), True),
        ("boolean", pa.bool_(), False),
        ("int", pa.int32(), False),
        ("long", pa.int64(), False),
        ("float", pa.float32(), False),
        ("double", pa.float64(), False),
        ("bytes", pa.binary(), False),
        ("string", pa.string(), False),
        ({"type": "record", "name": "S", "fields": [{"name": "x", "type": ["int", "null"]}]},
         pa.struct([pa.field("x", pa.int32())]), False),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, pa.dictionary(pa.int32(), pa.string()),
         False),
        ({"type": "array", "items": "long"}, pa.list_(pa.field("item", pa.int64(), False)), False),
        ({"type": "map", "values": ["null", "int"]},
         pa.map_(pa.field("key", pa.string(), False), pa.field("value", pa.int32())), False),
        ({"type": "fixed", "name": "F3", "size": 3}, pa.binary(3), False),
        (["null", "string"], pa.string(), True),
        (["string", "null"], pa.string(), True),
        (["int", "E", "null"], pa.dense_union(
            [pa.field("int", pa.int32(), False),
             pa.field("E", pa.dictionary(pa.int32(), pa.string()), False),
             pa.field("null", pa.null())], [0, 1, 2]), True),
        (["int", "string"], pa.dense_union(
            [pa.field("int", pa.int32(), False), pa.field("string", pa.string(), False)], [0, 1]),
         False),
        ({"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 2},
         pa.decimal128(38, 2), False),
        ({"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 2},
         pa.decimal256(39, 2), False),
        ({"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18},
         pa.decimal128(18, 0), False),
        ({"type": "string", "logicalType": "uuid"}, pa.uuid(), False),
        ({"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}, pa.uuid(), False),
        ({"type": "int", "logicalType": "date"}, pa.date32(), False),
        ({"type": "int", "logicalType": "time-millis"}, pa.time32("ms"), False),
        ({"type": "long", "logicalType": "time-micros"}, pa.time64("us"), False),
        ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("ms", "UTC"), False),
        ({"type": "long", "logicalType": "timestamp-micros"}, pa.timestamp("us", "UTC"), False),
        ({"type": "long", "logicalType": "timestamp-nanos"}, pa.timestamp("ns", "UTC"), False),
        ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.timestamp("ms"), False),
        ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us"), False),
        ({"type": "long", "logicalType": "local-timestamp-nanos"}, pa.timestamp("ns"), False),
        ({"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"},
         pa.month_day_nano_interval(), False),
        ({"type": "int", "logicalType": "unknown-thing"}, pa.int32(), False),
    ]
    schema = {
        "type": "record",
        "name": "All",
        "fields": [{"name": f"c{i}", "type": t} for i, (t, _, _) in enumerate(fields)],
    }
    arrow = to_arrow_schema(schema)
    assert arrow.names == [f"c{i}" for i in range(len(fields))]
    for i, (_, expected, nullable) in enumerate(fields):
        assert arrow.field(i).type == expected, f"c{i}"
        assert arrow.field(i).nullable is nullable, f"c{i}"
    assert parse_schema(json.loads(arrow.metadata[b"avro.schema"])) == parse_schema(schema)


def test_non_record_top_level_is_one_value_column() -> None:
    arrow = parse_schema(["null", {"type": "array", "items": "string"}]).arrow_schema
    assert arrow.names == ["value"]
    assert arrow.field(0).type == pa.list_(pa.field("item", pa.string(), False))
    assert arrow.field(0).nullable


def test_dense_union_children_use_fullnames() -> None:
    s = parse_schema(
        {"type": "record", "name": "R", "namespace": "ns", "fields": [{"name": "u", "type": [
            {"type": "record", "name": "A", "fields": []},
            {"type": "fixed", "name": "B", "size": 2},
            {"type": "array", "items": "int"},
            {"type": "map", "values": "int"}]}]}
    )
    assert [f.name for f in s.arrow_schema.field("u").type] == ["ns.A", "ns.B", "array", "map"]


def test_a_recursive_reference_maps_to_binary_holding_its_records_schema() -> None:
    s = parse_schema(
        {"type": "record", "name": "LinkedList", "fields": [
            {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "LinkedList"]}]}
    )
    field = s.arrow_schema.field("next")
    assert (field.type, field.nullable) == (pa.binary(), True)
    assert field.metadata == {b"avro.schema": s.json.encode()}  # the whole record: it recurses


def test_named_type_used_twice_is_not_recursion() -> None:
    s = parse_schema(
        {"type": "record", "name": "R", "fields": [
            {"name": "a", "type": {"type": "record", "name": "P", "fields": [
                {"name": "x", "type": "int"}]}},
            {"name": "b", "type": "P"}]}
    )
    assert s.arrow_schema.field("a").type == s.arrow_schema.field("b").type


# -- Java's "$" in namespaces ----------------------------------------------------------------------

INNER = {"type": "record", "name": "Inner", "namespace": "com.example.Outer$", "fields": [
    {"name": "a", "type": "int"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["X", "Y"]}},
    {"name": "other", "type": {"type": "fixed", "name": "Id", "namespace": "com.$x.Nest$ed",
                               "size": 2}},
    {"name": "again", "type": "com.$x.Nest$ed.Id"},
]}


def test_java_inner_class_namespaces_with_dollar_are_accepted() -> None:
    schema = parse_schema(INNER)
    assert isinstance(schema.root, Record) and schema.root.name == "com.example.Outer$.Inner"
    assert set(schema.names) == {"com.example.Outer$.Inner", "com.example.Outer$.Kind",
                                 "com.$x.Nest$ed.Id"}
    assert parse_schema(schema.json) == schema  # round trip through its JSON
    assert parse_schema(schema.canonical_form).canonical_form == schema.canonical_form
    reference = fastavro.schema.to_parsing_canonical_form(INNER)
    assert schema.canonical_form == reference
    for algorithm in ("CRC-64-AVRO", "MD5", "SHA-256"):
        assert fingerprint(INNER, algorithm).hex() == fastavro.schema.fingerprint(reference,
                                                                                  algorithm)
    record = {"a": 7, "kind": "Y", "other": b"hi", "again": b"yo"}
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(INNER), record)
    batch = decode([buffer.getvalue()], schema)
    assert batch.to_pylist() == [record]
    container = io.BytesIO()
    write_ocf(batch, container, codec="null")
    assert list(fastavro.reader(io.BytesIO(container.getvalue()))) == [record]
    assert read_ocf(container.getvalue()).to_pylist() == [record]
    # dotted names carry their namespace too
    dotted = parse_schema({"type": "fixed", "name": "a.B$.C", "size": 1})
    assert dotted.canonical_form == '{"name":"a.B$.C","type":"fixed","size":1}'


@pytest.mark.parametrize("spec", [
    {"type": "record", "name": "Inner$", "namespace": "com.example", "fields": []},
    {"type": "fixed", "name": "com.Outer.In$ner", "size": 1},
    {"type": "enum", "name": "E", "namespace": "com..x", "symbols": ["A"]},
    {"type": "enum", "name": "E", "namespace": "com.1x", "symbols": ["A"]},
    {"type": "record", "name": "R", "fields": [{"name": "a$", "type": "int"}]},
])
def test_dollar_stays_out_of_names_fields_and_empty_namespace_parts(spec: Any) -> None:
    with pytest.raises(AvroSchemaError, match=r"invalid (field )?name"):
        parse_schema(spec)


def test_a_schema_given_again_is_not_parsed_again_unless_it_changed() -> None:
    """Equal JSON text, and the same unchanged dict, give the Schema parsed the first time; a
    dict changed in place is parsed again (decode and encode parse what they are given in
    every call)."""
    from arrowstash.avro import schema as schema_module

    record = {"type": "record", "name": "Again", "fields": [{"name": "a", "type": "long"}]}
    first = parse_schema(record)
    assert parse_schema(record) is first
    text = json.dumps(record)
    assert parse_schema(json.dumps(record)) is parse_schema(text)
    record["fields"].append({"name": "b", "type": "string"})  # changed in place
    changed = parse_schema(record)
    assert changed is not first and [f.name for f in changed.root.fields] == ["a", "b"]
    assert [f.name for f in first.root.fields] == ["a"]
    from types import MappingProxyType

    frozen = MappingProxyType({"type": "record", "name": "Frozen", "fields": []})
    assert parse_schema(frozen).json == parse_schema(frozen).json  # not copied, parsed each time
    for i in range(200):  # the memory of them stays bounded
        parse_schema({"type": "record", "name": f"R{i}", "fields": []})
    assert len(schema_module._RECENT) <= schema_module._RECENT_MAX
