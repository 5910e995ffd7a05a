"""The native decoder hands its batch to Arrow through the C Data Interface: one tree of
ArrowArrays that owns the decoded buffers, imported in one call. These tests pin what that
hand-over must keep: the memory goes back when Arrow lets the batch go, an enum's dictionary
does not depend on the plan it came from, and a plan nested deeper than Arrow's import accepts
(64 levels) still decodes."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from _avro_strategies import write
from arrowstash.avro import decode, parse_schema
from arrowstash.avro import writer_decoder as codec
from arrowstash.avro.writer_decoder import decode_messages

pytestmark = pytest.mark.skipif(
    codec._cdecode is None, reason="the native Avro decoder is not built (no C compiler)"
)

EVERY_LAYOUT = {"type": "record", "name": "R", "fields": [
    {"name": "s", "type": ["null", "string"]},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["Alpha", "B_", "ccc"]}},
    {"name": "m", "type": {"type": "map", "values": ["null", "long"]}},
    {"name": "a", "type": {"type": "array", "items": {"type": "record", "name": "I", "fields": [
        {"name": "b", "type": "boolean"}, {"name": "n", "type": "null"}]}}},
    {"name": "u", "type": ["null", "int", "string", "E"]},
    {"name": "f", "type": {"type": "fixed", "name": "F", "size": 3}},
    {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                           "scale": 2}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
]}


def _records(n: int) -> list[dict]:
    import decimal
    import uuid

    return [{
        "s": None if i % 3 == 0 else f"s{i}", "e": ["Alpha", "B_", "ccc"][i % 3],
        "m": {f"k{j}": (None if j == 1 else j) for j in range(i % 3)},
        "a": [{"b": j % 2 == 0, "n": None} for j in range(i % 4)],
        "u": [None, i, f"u{i}", "ccc"][i % 4], "f": bytes([i % 256]) * 3,
        "d": decimal.Decimal(i) / 100, "id": str(uuid.UUID(int=i)),
    } for i in range(n)]


@pytest.mark.parametrize("threads", [1, 2])
def test_every_layout_is_imported_as_the_python_decoder_builds_it(threads: int,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    monkeypatch.setattr(codec, "_MIN_BYTES_PER_THREAD", 1)
    messages = write(EVERY_LAYOUT, _records(3000))
    parsed = parse_schema(EVERY_LAYOUT)
    native, _ = decode_messages(messages, parsed, threads=threads, native=True)
    python, _ = decode_messages(messages, parsed, threads=1, native=False)
    native.validate(full=True)
    assert native.equals(python)
    assert native.schema == parsed.arrow_schema


def test_an_enums_dictionary_outlives_the_plan_it_came_from() -> None:
    schema = {"type": "record", "name": "Only", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "Sym", "symbols": ["zero", "one"]}}]}
    batch = decode(write(schema, [{"e": "one"}, {"e": "zero"}]), schema)
    codec._native_plan.cache_clear()  # the plan object, and the symbols it holds, are gone
    gc.collect()
    decode(write(schema, [{"e": "one"}]), {**schema, "name": "Other"})  # memory reused
    assert batch.column("e").dictionary.to_pylist() == ["zero", "one"]
    assert batch.to_pylist() == [{"e": "one"}, {"e": "zero"}]


def test_a_record_without_fields_keeps_its_row_count() -> None:
    schema = {"type": "record", "name": "Empty", "fields": []}
    batch = decode([b"", b"", b""], schema)
    assert (batch.num_rows, batch.num_columns) == (3, 0)


def test_a_plan_deeper_than_arrows_import_decodes_through_per_node_buffers() -> None:
    inner: object = "long"
    for _ in range(70):  # 70 list levels: past the 64 Arrow's C import takes
        inner = {"type": "array", "items": inner}
    schema = {"type": "record", "name": "Deep", "fields": [{"name": "v", "type": inner}]}
    value: object = 7
    for _ in range(70):
        value = [value]
    exported = codec._cdecode.decode_list(codec._native_plan(parse_schema(schema)),
                                          write(schema, [{"v": value}]), None, 1, True, False, 0)
    assert isinstance(exported[1], list)  # per-node buffers, not an ArrowArray
    assert decode(write(schema, [{"v": value}]), schema).to_pylist() == [{"v": value}]


_RELEASE_SCRIPT = """
import resource, sys
from arrowstash.avro import decode, parse_schema
from arrowstash.avro import writer_decoder as codec
schema = {"type": "record", "name": "R", "fields": [
    {"name": "s", "type": "string"}, {"name": "n", "type": ["null", "long"]}]}
messages = [b"\\x80\\x01" + b"x" * 64 + b"\\x02\\x04"] * 200_000  # 13 MB of strings a batch
plan = codec._native_plan(parse_schema(schema))
def once():
    if sys.argv[1] == "import":
        assert decode(messages, schema, threads=1).num_rows == 200_000
    else:  # the result dropped before any import: its capsule releases the tree
        status, exported, _ = codec._cdecode.decode_list(plan, messages, None, 1, True, False, 0)
        assert status == 0 and isinstance(exported, tuple)
once()
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(40):
    once()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) // 1024)
"""


@pytest.mark.parametrize("how", ["import", "drop"])
def test_a_batch_let_go_gives_its_memory_back(how: str) -> None:
    """40 batches of 14 MB decoded and let go one after the other (imported and dropped, or
    dropped before any import): without the release the process would grow by 0.5 GB."""
    out = subprocess.run([sys.executable, "-c", _RELEASE_SCRIPT, how], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 60, f"peak RSS grew {out.stdout.strip()} MB"
