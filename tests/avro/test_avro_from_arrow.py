"""Arrow schema -> Avro schema: the inverse of the decode mapping, and clear refusals."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from arrowstash.avro.from_arrow import from_arrow_schema
from arrowstash.avro.schema import parse_schema
from arrowstash.errors import AvroSchemaError

fastavro = pytest.importorskip("fastavro")

#: Arrow types that are exactly what their Avro type decodes to: they must come back unchanged.
EXACT = pa.schema([
    pa.field("b", pa.bool_(), nullable=False),
    pa.field("i", pa.int32(), nullable=False),
    pa.field("l", pa.int64()),
    pa.field("f", pa.float32()),
    pa.field("d", pa.float64(), nullable=False),
    pa.field("s", pa.string()),
    pa.field("by", pa.binary(), nullable=False),
    pa.field("fx", pa.binary(6)),
    pa.field("dec", pa.decimal128(10, 3)),
    pa.field("big", pa.decimal256(60, 5), nullable=False),
    pa.field("u", pa.uuid()),
    pa.field("day", pa.date32()),
    pa.field("tms", pa.time32("ms")),
    pa.field("tus", pa.time64("us")),
    pa.field("ts_ms", pa.timestamp("ms", tz="UTC")),
    pa.field("ts_us", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("ts_ns", pa.timestamp("ns", tz="UTC")),
    pa.field("local_us", pa.timestamp("us")),
    pa.field("dur", pa.month_day_nano_interval()),
    pa.field("tags", pa.list_(pa.field("item", pa.string(), nullable=False))),
    pa.field("opt_items", pa.list_(pa.field("item", pa.int64()))),
    pa.field("counts", pa.map_(pa.field("key", pa.string(), nullable=False),
                               pa.field("value", pa.int64(), nullable=False))),
    pa.field("nested", pa.struct([pa.field("x", pa.int32(), nullable=False),
                                  pa.field("y", pa.struct([pa.field("z", pa.string())]))])),
])


def test_exact_types_map_back_to_themselves() -> None:
    schema = from_arrow_schema(EXACT)
    assert schema.arrow_schema.remove_metadata() == EXACT
    fastavro.parse_schema(json.loads(schema.json))  # another implementation accepts it


def test_nullable_fields_are_null_unions_with_default_null() -> None:
    schema = from_arrow_schema(pa.schema([pa.field("a", pa.int64()),
                                          pa.field("b", pa.int64(), nullable=False)]),
                               name="Row", namespace="com.example")
    doc = json.loads(schema.json)
    assert doc["name"] in ("Row", "com.example.Row")
    fields = {f["name"]: f for f in doc["fields"]}
    assert fields["a"]["type"] == ["null", "long"] and fields["a"]["default"] is None
    assert fields["b"]["type"] == "long" and "default" not in fields["b"]


@pytest.mark.parametrize(
    ("arrow", "decoded"),
    [
        (pa.int8(), pa.int32()),
        (pa.int16(), pa.int32()),
        (pa.uint8(), pa.int32()),
        (pa.uint16(), pa.int32()),
        (pa.uint32(), pa.int64()),
        (pa.float16(), pa.float32()),
        (pa.large_string(), pa.string()),
        (pa.string_view(), pa.string()),
        (pa.large_binary(), pa.binary()),
        (pa.binary_view(), pa.binary()),
        (pa.date64(), pa.date32()),
        (pa.time32("s"), pa.time32("ms")),
        (pa.timestamp("s", tz="UTC"), pa.timestamp("ms", tz="UTC")),
        (pa.timestamp("us", tz="Europe/Paris"), pa.timestamp("us", tz="UTC")),
        (pa.timestamp("ns"), pa.timestamp("ns")),
        (pa.large_list(pa.int32()), pa.list_(pa.int32())),
        (pa.list_(pa.int32(), 3), pa.list_(pa.int32())),
        (pa.dictionary(pa.int8(), pa.string()), pa.string()),
        (pa.dictionary(pa.int32(), pa.int64()), pa.int64()),
    ],
)
def test_wider_arrow_types_map_to_the_nearest_avro_type(
    arrow: pa.DataType, decoded: pa.DataType
) -> None:
    schema = from_arrow_schema(pa.schema([pa.field("v", arrow, nullable=False)]))
    assert schema.arrow_schema.field("v").type == decoded


def test_dictionary_columns_of_a_table_become_enums() -> None:
    table = pa.table({
        "colour": pa.array(["RED", "GREEN", "RED"]).dictionary_encode(),
        "free": pa.array(["has space", "x", "x"]).dictionary_encode(),
    })
    doc = json.loads(from_arrow_schema(table).json)
    colour, free = doc["fields"]
    assert colour["type"][1]["type"] == "enum"
    assert colour["type"][1]["symbols"] == ["RED", "GREEN"]
    assert free["type"] == ["null", "string"]  # "has space" is no Avro symbol


def test_named_types_get_unique_names() -> None:
    point = pa.struct([pa.field("x", pa.int32())])
    schema = from_arrow_schema(pa.schema([pa.field("a", point), pa.field("b", point),
                                          pa.field("c", pa.list_(point))]))
    doc = json.loads(schema.json)
    names = [f["type"][1]["name"] for f in doc["fields"][:2]]
    assert len(set(names)) == 2
    fastavro.parse_schema(doc)


def test_a_decoded_schema_maps_back_to_its_avro_schema() -> None:
    avro = parse_schema({"type": "record", "name": "Ev", "fields": [
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "u", "type": ["int", "string"]},
    ]})
    assert from_arrow_schema(avro.arrow_schema) == avro
    changed = avro.arrow_schema.append(pa.field("extra", pa.int64()))
    assert from_arrow_schema(changed) != avro  # stale metadata is ignored


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (pa.field("n", pa.uint64()), r"Record.n: Arrow type uint64 has no Avro equivalent"),
        (pa.field("t", pa.time64("ns")), r"Record.t: Avro times stop at microseconds"),
        (pa.field("d", pa.duration("s")), r"Record.d: Arrow type duration\[s\] has no Avro"),
        (pa.field("m", pa.map_(pa.int32(), pa.int32())),
         r"Record.m: Avro map keys are strings, not int32"),
        (pa.field("bad name", pa.int32()), r"'bad name' is not a valid Avro field name"),
        (pa.field("s", pa.struct([pa.field("1x", pa.int32())])), r"Record.s.1x"),
        (pa.field("l", pa.list_(pa.uint64())), r"Record.l\[\]: Arrow type uint64"),
    ],
)
def test_unmappable_types_name_the_field(field: pa.Field, message: str) -> None:
    with pytest.raises(AvroSchemaError, match=message):
        from_arrow_schema(pa.schema([field]))


def test_invalid_record_name() -> None:
    with pytest.raises(AvroSchemaError, match="record name 'my-record'"):
        from_arrow_schema(pa.schema([pa.field("a", pa.int32())]), name="my-record")
