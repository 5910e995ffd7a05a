"""The native decoder against the pure-Python one on deep nesting (records, arrays, maps and
nullables 15 to 40 levels down) and on strings and bytes of every size around 16, 64 and 2 KiB
and far past them, mostly non-ASCII, with nulls of records of strings; errors too."""

from __future__ import annotations

import random
from typing import Any

import pytest
from test_avro_native import assert_same, both

from _avro_strategies import write
from arrowstash.avro import writer_decoder as codec

pytestmark = pytest.mark.skipif(
    codec._cdecode is None, reason="the native Avro decoder is not built (no C compiler)"
)


def nested(depth: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A record nesting `depth` levels, each an optional record inside an array or a map."""
    schema: Any = {"type": "record", "name": "Leaf",
                   "fields": [{"name": "s", "type": "string"}, {"name": "i", "type": "int"}]}
    value: Any = {"s": "é" * 3, "i": 7}
    for k in range(depth):
        kind = k % 3
        fields = [{"name": "tag", "type": ["null", "string"]}]
        if kind == 0:
            fields.append({"name": "x", "type": ["null", schema]})
        elif kind == 1:
            fields.append({"name": "x", "type": {"type": "array", "items": schema}})
            value = [value, value] if k % 2 else [value]
        else:
            fields.append({"name": "x", "type": {"type": "map", "values": schema}})
            value = {"a": value}
        schema = {"type": "record", "name": f"L{k}", "fields": fields}
        value = {"tag": None if k % 2 else f"t{k}", "x": value}
    return schema, value


@pytest.mark.parametrize("depth", [15, 16, 17, 40])
def test_deep_nesting_matches_python(depth: int) -> None:
    schema, value = nested(depth)
    msgs = write(schema, [value] * 3)
    assert_same(*both(msgs, schema))
    for cut in (1, len(msgs[0]) // 2, len(msgs[0]) - 1):  # errors deep inside, same report
        native, python = both([msgs[0], msgs[1][:cut]], schema)
        assert isinstance(python, str)
        assert native == python


ROOMY = {
    "type": "record", "name": "R",
    "fields": [
        {"name": "a", "type": "string"},
        {"name": "b", "type": ["null", "bytes"]},
        {"name": "opt", "type": ["null", {"type": "record", "name": "O", "fields": [
            {"name": "x", "type": "string"}, {"name": "y", "type": "string"},
            {"name": "z", "type": ["null", "string"]}]}]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def roomy_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Strings of every size around 2 KiB and far past it, mostly non-ASCII, and
    nulls of a record of strings (offsets with no string bytes)."""
    rng = random.Random(seed)
    sizes = [0, 1, 15, 16, 17, 63, 64, 65, 2000, 2047, 2048, 2049, 5000, 70_000]

    def text() -> str:
        return "".join(rng.choice("aé水🙂") for _ in range(rng.choice(sizes) // 3))

    rows = []
    for _ in range(n):
        rows.append({
            "a": text(),
            "b": None if rng.random() < 0.3 else text().encode(),
            "opt": None if rng.random() < 0.5 else {"x": text(), "y": "", "z": text()},
            "tags": [text() for _ in range(rng.randrange(4))],
        })
    return rows


@pytest.mark.parametrize("threads", [1, 2])
def test_strings_of_every_size_match_python(threads: int) -> None:
    msgs = write(ROOMY, roomy_rows(400, threads))
    native, python = both(msgs, ROOMY, threads=threads)
    assert_same(native, python)


def test_a_string_cut_short_or_negative_after_many_is_reported_like_python() -> None:
    msgs = write(ROOMY, roomy_rows(100, 3))
    last = msgs[-1]
    for broken in (last[: len(last) - 2], b"\x03"):  # truncated; a length of -2
        native, python = both([*msgs[:-1], broken], ROOMY)
        assert isinstance(python, str)
        assert native == python
