"""The native decoder against the pure-Python one on deep nesting (records, arrays, maps and
nullables 15 to 40 levels down), on strings and bytes of every size around 16, 64 and 2 KiB
and far past them, mostly non-ASCII, with nulls of records of strings, on optional leaves
(either side of null) mixed with nulls at random, and on null records holding every kind;
errors too."""

from __future__ import annotations

import decimal
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


OPTIONAL = {
    "type": "record", "name": "Opt",
    "fields": [
        {"name": "s", "type": ["null", "string"]},
        {"name": "t", "type": ["string", "null"]},
        {"name": "i", "type": ["null", "int"]},
        {"name": "j", "type": ["int", "null"]},
        {"name": "l", "type": ["null", "long"]},
        {"name": "m", "type": ["long", "null"]},
        {"name": "b", "type": ["null", "bytes"]},
        {"name": "e", "type": ["null", {"type": "enum", "name": "E", "symbols": ["X", "Y"]}]},
    ],
}


def optional_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Nulls at random between values of the optional leaves that records decode in code of
    their own (strings, ints and longs either side of null), and of the others: ints and longs
    of one to ten bytes, strings of 0 to 100 bytes, mostly non-ASCII."""
    rng = random.Random(seed)

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.5 else value

    def number(bits: int) -> int:
        return rng.choice([-1, 1]) * (rng.getrandbits(rng.randrange(1, bits)))

    def text() -> str:
        return "".join(rng.choice("aé水🙂") for _ in range(rng.randrange(0, 40)))

    return [{"s": maybe(text()), "t": maybe(text()), "i": maybe(number(31)),
             "j": maybe(number(31)), "l": maybe(number(63)), "m": maybe(number(63)),
             "b": maybe(text().encode()), "e": maybe(rng.choice("XY"))} for _ in range(n)]


@pytest.mark.parametrize("threads", [1, 2])
def test_optional_leaves_match_python(threads: int) -> None:
    msgs = write(OPTIONAL, optional_rows(2000, threads))
    assert_same(*both(msgs, OPTIONAL, threads=threads))
    for k in range(0, 40):  # every cut of a message: the same error as Python's
        cut = msgs[k][: k % len(msgs[k])]
        native, python = both([*msgs[:k], cut], OPTIONAL)
        assert native == python
    nulls = write(OPTIONAL, [dict.fromkeys(f["name"] for f in OPTIONAL["fields"])])[0]
    for at in range(len(nulls)):  # branch 2 of a 2-branch union, in each field's place
        native, python = both([nulls[:at] + b"\x04" + nulls[at + 1:]], OPTIONAL)
        assert isinstance(python, str)
        assert native == python


EVERY = {
    "type": "record", "name": "Every",
    "fields": [
        {"name": "b", "type": "boolean"}, {"name": "i", "type": "int"},
        {"name": "l", "type": "long"}, {"name": "f", "type": "float"},
        {"name": "d", "type": "double"}, {"name": "by", "type": "bytes"},
        {"name": "s", "type": "string"},
        {"name": "fx", "type": {"type": "fixed", "name": "F3", "size": 3}},
        {"name": "e", "type": {"type": "enum", "name": "E2", "symbols": ["X", "Y"]}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                 "scale": 2}},
        {"name": "decf", "type": {"type": "fixed", "name": "F5", "size": 5,
                                  "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "a", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": "string"}},
        {"name": "un", "type": ["int", "null", "string"]},
        {"name": "on", "type": ["null", "string"]},
        {"name": "r", "type": {"type": "record", "name": "In", "fields": [
            {"name": "x", "type": ["null", "long"]}]}},
    ],
}
HOLDER = {"type": "record", "name": "Holder", "fields": [
    {"name": "o", "type": ["null", EVERY]}, {"name": "tail", "type": "string"}]}


def test_a_null_record_of_every_kind_matches_python() -> None:
    """A null record fills a slot in every column below it (empty()): each kind's, between
    records that are there, so that offsets and type ids must carry on from the nulls."""
    rng = random.Random(9)
    present = {"b": True, "i": -5, "l": 1 << 40, "f": 1.5, "d": -2.25, "by": b"\x00\x01",
               "s": "é", "fx": b"abc", "e": "Y", "u": "12345678-1234-5678-1234-567812345678",
               "dec": decimal.Decimal("12.34"), "decf": decimal.Decimal("-0.05"),
               "a": [1, 2, 3], "m": {"k": "v"}, "un": "w", "on": "z", "r": {"x": 7}}
    rows = [{"o": present if rng.random() < 0.4 else None, "tail": f"t{k}"} for k in range(300)]
    for threads in (1, 2):
        assert_same(*both(write(HOLDER, rows), HOLDER, threads=threads))
