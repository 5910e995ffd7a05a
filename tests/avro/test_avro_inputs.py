"""The forms decode takes its messages in: a list of bytes (what Kafka clients hand over, read in
place), bytearray and memoryview items among them, empty and null messages, and items that are
not messages at all (a clear error naming the index and the type, never a crash)."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from arrowstash import AvroDecodeError
from arrowstash.avro import decode

SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
NOTHING = {"type": "record", "name": "N", "fields": [{"name": "n", "type": "null"}]}


def write(schema: dict[str, Any], rows: list[dict[str, Any]]) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for row in rows:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, row)
        out.append(buffer.getvalue())
    return out


def rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"nom {i} é" * (i % 4), "tags": [f"t{i}"] * (i % 3),
             "note": None if i % 2 else "ñ"} for i in range(n)]


def mixed(messages: list[bytes]) -> list[Any]:
    """The same messages as bytes, bytearray, memoryview, and memoryview slices of a bigger
    buffer (at an offset, not aligned)."""
    out: list[Any] = []
    for i, m in enumerate(messages):
        kind = i % 4
        if kind == 1:
            out.append(bytearray(m))
        elif kind == 2:
            out.append(memoryview(m))
        elif kind == 3:
            out.append(memoryview(b"\xff" * 3 + m + b"\xff")[3:-1])
        else:
            out.append(m)
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_a_list_of_bytes_decodes_as_the_binary_array_does(threads: int) -> None:
    data = rows(70_000)
    messages = write(SCHEMA, data)
    assert sum(map(len, messages)) > 2 << 20  # enough for two threads to share it
    expected = decode(pa.array(messages, pa.binary()), SCHEMA, threads=1)
    assert expected.to_pylist() == data
    for form in (messages, tuple(messages), iter(messages), mixed(messages)):
        got = decode(form, SCHEMA, threads=threads)
        got.validate(full=True)
        assert got.equals(expected)


def test_empty_messages_are_messages() -> None:
    """An empty message is a whole datum of a schema that takes no bytes, and a truncated one
    (named by its index) of any other."""
    assert decode([b"", b"", bytearray(), memoryview(b"")], NOTHING).num_rows == 4
    assert decode([], SCHEMA).num_rows == 0
    messages = write(SCHEMA, rows(10))
    for at in (0, 5, 10):
        broken = [*messages[:at], b"", *messages[at:]]
        with pytest.raises(AvroDecodeError, match=rf"^message {at} at byte 0"):
            decode(broken, SCHEMA)


def test_a_null_message_is_named() -> None:
    messages: list[Any] = write(SCHEMA, rows(5))
    messages[3] = None
    with pytest.raises(AvroDecodeError, match=r"^message 3 .*null"):
        decode(messages, SCHEMA)


@pytest.mark.parametrize("item", [7, "text", 1.5, {"id": 1}, [b"\x00"], object()],
                         ids=["int", "str", "float", "dict", "list", "object"])
def test_an_item_that_is_not_a_message_is_named_with_its_type(item: Any) -> None:
    messages: list[Any] = write(SCHEMA, rows(5))
    messages.insert(2, item)
    with pytest.raises(TypeError, match=rf"^message 2 is a {type(item).__name__}, not bytes"):
        decode(messages, SCHEMA)


def test_a_memoryview_that_is_not_contiguous_is_named() -> None:
    messages: list[Any] = write(SCHEMA, rows(5))
    doubled = bytes(b for byte in messages[1] for b in (byte, 0))
    messages[1] = memoryview(doubled)[::2]
    with pytest.raises(BufferError, match=r"^message 1: "):
        decode(messages, SCHEMA)


def test_the_callers_list_is_left_as_it_was() -> None:
    messages = write(SCHEMA, rows(100))
    before = list(messages)
    decode(messages, SCHEMA, threads=2)
    assert messages == before and all(a is b for a, b in zip(messages, before, strict=True))
