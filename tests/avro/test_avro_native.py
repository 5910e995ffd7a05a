"""The native (C) Avro decoder against the pure-Python one: same batches, same errors, no crash
on random bytes, the GIL released while it runs, threads giving the same result as one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import tracemalloc
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _avro_strategies import schema_and_records, write
from arrowstash import AvroDecodeError
from arrowstash.avro import decode_blocks, parse_schema
from arrowstash.avro import writer_decoder as codec
from arrowstash.avro.writer_decoder import decode_messages

pytestmark = pytest.mark.skipif(
    codec._cdecode is None, reason="the native Avro decoder is not built (no C compiler)"
)


@pytest.fixture(autouse=True)
def split_small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests' batches are small: let them be split across threads all the same."""
    monkeypatch.setattr(codec, "_MIN_BYTES_PER_THREAD", 1)


def both(messages: Any, schema: Any, **kw: Any) -> tuple[Any, Any]:
    """(native outcome, Python outcome): each a (batch, ids) pair or the error's text."""
    parsed = parse_schema(schema)
    out = []
    for native in (True, False):
        try:
            batch, ids = decode_messages(messages, parsed, native=native, **kw)
            out.append((batch, ids.to_pylist()))
        except AvroDecodeError as exc:
            out.append(str(exc))
    return out[0], out[1]


def assert_same(native: Any, python: Any) -> None:
    if isinstance(python, str):
        assert native == python
        return
    assert not isinstance(native, str), native
    native[0].validate(full=True)
    # equals() holds NaN unequal to itself: a flipped byte of a float may well make one
    assert native[0].equals(python[0]) or _nan_free(native[0].to_pylist()) == _nan_free(
        python[0].to_pylist()
    )
    assert native[0].schema == python[0].schema
    assert native[1] == python[1]


def _nan_free(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, (list, tuple)):
        return [_nan_free(v) for v in value]
    if isinstance(value, dict):
        return {k: _nan_free(v) for k, v in value.items()}
    return value


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=schema_and_records(), threads=st.integers(1, 3))
def test_native_equals_python_on_valid_messages(
    case: tuple[dict[str, Any], list[Any]], threads: int
) -> None:
    schema, records = case
    messages = write(schema, records)
    native, python = both(messages, schema, threads=threads)
    assert_same(native, python)
    arr = pa.array(messages, pa.binary())
    assert_same(both(arr, schema)[0], python)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=schema_and_records(), data=st.data())
def test_native_equals_python_on_broken_messages(
    case: tuple[dict[str, Any], list[Any]], data: st.DataObject
) -> None:
    """Truncations, extensions, flipped bytes and random garbage: the same error text (code,
    message index, offset, field) from both decoders, or the same batch."""
    schema, records = case
    messages = write(schema, records) or [b""]
    i = data.draw(st.integers(0, len(messages) - 1))
    m = messages[i]
    choice = data.draw(st.sampled_from(["cut", "extend", "flip", "garbage"]))
    if choice == "cut":
        bad = m[: data.draw(st.integers(0, max(0, len(m) - 1)))]
    elif choice == "extend":
        bad = m + data.draw(st.binary(min_size=1, max_size=4))
    elif choice == "flip" and m:
        j = data.draw(st.integers(0, len(m) - 1))
        bad = m[:j] + bytes([m[j] ^ data.draw(st.integers(1, 255))]) + m[j + 1 :]
    else:
        bad = data.draw(st.binary(max_size=40))
    trial = [*messages[:i], bad, *messages[i + 1 :]]
    native, python = both(trial, schema)
    assert_same(native, python)


@settings(max_examples=300, deadline=None)
@given(garbage=st.lists(st.binary(max_size=64), min_size=1, max_size=8))
def test_native_never_crashes_on_random_bytes(garbage: list[bytes]) -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": ["null", "string"]},
        {"name": "a", "type": {"type": "array", "items": {"type": "map", "values": "long"}}},
        {"name": "u", "type": ["int", "bytes", {"type": "fixed", "name": "F", "size": 3},
                               {"type": "enum", "name": "E", "symbols": ["A", "B"]}]},
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20}},
        {"name": "t", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "dur", "type": {"type": "fixed", "name": "D", "size": 12,
                                 "logicalType": "duration"}},
        {"name": "r", "type": {"type": "record", "name": "In", "fields": [
            {"name": "b", "type": "boolean"}, {"name": "f", "type": "float"}]}},
    ]}
    native, python = both(garbage, schema)
    assert_same(native, python)


def test_errors_and_inputs_match_for_every_input_form() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
    messages = write(schema, [{"s": "x" * i} for i in range(300)])
    bad = [*messages[:200], b"\x04\xff\xfe", *messages[201:]]
    arr = pa.array(bad, pa.binary())
    data = b"".join(bad)
    offsets = [0]
    for m in bad:
        offsets.append(offsets[-1] + len(m))
    for form in (bad, arr, pa.array(bad, pa.large_binary()), (data, offsets),
                 (pa.py_buffer(data), pa.array(offsets, pa.int32()))):
        native, python = both(form, schema, threads=2)
        assert native == python == "message 200 at byte 0: invalid UTF-8 in string at s"
    native, python = both(arr.slice(150, 100), schema)
    assert native == python == "message 50 at byte 0: invalid UTF-8 in string at s"
    with_null = pa.array([*messages[:3], None, *messages[3:]], pa.binary())
    assert both(with_null, schema)[0] == "message 3 at byte 0: message is null"
    native_ok, python_ok = both(pa.array(messages, pa.binary()).slice(7, 40), schema)
    assert_same(native_ok, python_ok)


def test_threads_split_rows_but_not_results() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": ["null", "string"]},
        {"name": "b", "type": "boolean"},
        {"name": "l", "type": {"type": "array", "items": ["int", "string", "null"]}},
        {"name": "m", "type": {"type": "map", "values": {"type": "enum", "name": "E",
                                                          "symbols": ["A", "B"]}}},
        {"name": "r", "type": ["null", {"type": "record", "name": "In", "fields": [
            {"name": "x", "type": "long"}, {"name": "y", "type": "bytes"}]}]}]}
    records = [
        {"s": None if i % 3 == 0 else f"s{i}", "b": i % 2 == 0,
         "l": [i, f"v{i}", None][: i % 4], "m": {f"k{j}": "AB"[j % 2] for j in range(i % 3)},
         "r": None if i % 5 == 0 else {"x": i, "y": bytes([i % 256]) * (i % 7)}}
        for i in range(5000)
    ]
    messages = write(schema, records)
    one, _ = decode_messages(messages, parse_schema(schema), threads=1, native=True)
    for threads in (2, 3, 7):
        many, _ = decode_messages(messages, parse_schema(schema), threads=threads, native=True)
        many.validate(full=True)
        assert many.equals(one)
    python, _ = decode_messages(messages, parse_schema(schema), native=False)
    assert one.equals(python)
    blocks = [(b"".join(messages[i : i + 700]), len(messages[i : i + 700]))
              for i in range(0, 5000, 700)]
    assert decode_blocks(blocks, schema, threads=2).equals(one)


def test_large_parts_merge_like_one_thread() -> None:
    """Parts of 64 KiB and more are merged around the cache, from and to any alignment: the
    threads' batch is the one thread's, and holds the records."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "n", "type": ["null", "long"]},
        {"name": "t", "type": {"type": "array", "items": "string"}}]}
    records = [{"s": "x" * (i % 61), "n": None if i % 7 == 0 else i * 3,
                "t": [f"{i}-{j}" for j in range(i % 4)]} for i in range(180_000)]
    messages = write(schema, records)  # "s": 5.4 MB of strings; a second thread's first part
    # holds about 20,000 rows: 80 kB of offsets in each column
    one, _ = decode_messages(messages, parse_schema(schema), threads=1, native=True)
    for threads in (2, 3):
        many, _ = decode_messages(messages, parse_schema(schema), threads=threads, native=True)
        many.validate(full=True)
        assert many.equals(one)
    assert one.slice(0, 3000).to_pylist() == records[:3000]
    assert one.slice(177_000).to_pylist() == records[177_000:]
    assert all(one.slice(i, 1).to_pylist()[0] == records[i] for i in range(0, 180_000, 997))


def test_fixed_width_fields_of_the_root_are_written_in_place_by_every_thread() -> None:
    """Such a field's column is laid out for the whole batch before the threads start (a row
    at its message's index): every thread's rows land there, from a list or an array, in
    ranges cut or not; the same kinds elsewhere (in a record, an array) are merged."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "i", "type": "int"}, {"name": "l", "type": "long"},
        {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
        {"name": "x", "type": {"type": "fixed", "name": "F", "size": 3}},
        {"name": "o", "type": ["null", "long"]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "s", "type": "string"},
        {"name": "r", "type": {"type": "record", "name": "In", "fields": [
            {"name": "l", "type": "long"}]}},
        {"name": "a", "type": {"type": "array", "items": "double"}}]}
    records = [{"i": -i, "l": i * 1_000_003, "f": float(i % 1000), "d": i / 7, "e": "ABC"[i % 3],
                "x": (i % 16_777_216).to_bytes(3, "little"), "o": None if i % 4 == 0 else i,
                "day": i % 30_000, "s": "s" * (i % 9), "r": {"l": -i},
                "a": [i / 3] * (i % 3)} for i in range(40_000)]
    messages = write(schema, records)
    parsed = parse_schema(schema)
    one, _ = decode_messages(messages, parsed, threads=1, native=True)
    assert one.slice(39_990).to_pylist() == decode_messages(
        messages[39_990:], parsed, native=False)[0].to_pylist()
    for form in (messages, pa.array(messages, pa.binary())):
        for threads in (2, 3, 4) * 3:
            many, _ = decode_messages(form, parsed, threads=threads, native=True)
            many.validate(full=True)
            assert many.equals(one)


def test_threads_out_of_work_cut_the_ranges_left() -> None:
    """A thread out of chunks takes the far half of another's range: batches decoded that way
    are the one thread's, and the first bad message, wherever it falls (in a range that was cut,
    or in the part cut off), is the one reported, as the pure-Python decoder reports it."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "long"}, {"name": "s", "type": "string"},
        {"name": "t", "type": {"type": "array", "items": ["null", "string"]}}]}
    records = [{"n": i, "s": f"ü{i}" * (1 + i % 13), "t": [None, f"{i}"][: i % 3]}
               for i in range(60_000)]
    messages = write(schema, records)  # 1.6 MB: the last chunks are worth cutting
    array = pa.array(messages, pa.binary())
    parsed = parse_schema(schema)
    one, _ = decode_messages(array, parsed, threads=1, native=True)
    before = codec._cdecode.cuts()
    for threads in (2, 3, 4) * 5:
        many, _ = decode_messages(array, parsed, threads=threads, native=True)
        many.validate(full=True)
        assert many.equals(one)
    for _ in range(200):  # a cut needs a thread to run out of work first: rarer on a busy machine
        if codec._cdecode.cuts() > before:
            break
        decode_messages(array, parsed, threads=4, native=True)
    assert codec._cdecode.cuts() > before
    for bad in (59_999, 58_000, 52_345, 45_000, 30_001):
        broken = list(messages)
        broken[bad] = broken[bad].replace("ü".encode(), b"\xc3\x28", 1)
        broken[-1] = broken[-1] + b"\x00"  # a later error too: trailing bytes
        expected = both(broken, schema, threads=1)[1]
        assert isinstance(expected, str) and f"message {bad} " in expected
        for threads in (2, 3):
            assert both(pa.array(broken, pa.binary()), schema, threads=threads)[0] == expected


def test_native_releases_the_gil_during_a_long_decode() -> None:
    """Another Python thread keeps running while one decode call works through a big batch."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "a", "type": {"type": "array", "items": "long"}}]}
    one = write(schema, [{"s": "x" * 50, "a": list(range(50))}])[0]
    blob = one * 60_000
    blocks = [(blob, 60_000)] * 4
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        time.sleep(0.05)
        before = ticks
        start = time.perf_counter()
        decode_blocks(blocks, schema, threads=1)
        elapsed = time.perf_counter() - start
        during = ticks - before
    finally:
        done.set()
        counter.join()
    # With the GIL held for the whole call the counter could not move at all (one switch at
    # most when the call starts); released, it runs all along.
    assert elapsed > 0.01
    assert during > 50, (during, elapsed)


def test_environment_switch_forces_the_python_decoder() -> None:
    code = (
        "from arrowstash.avro import writer_decoder as codec\n"
        "print(codec.native_available())\n"
    )
    env = dict(os.environ, ARROWSTASH_AVRO_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "False"
    assert codec.native_available()


@pytest.mark.parametrize("threads", [1, 2])
def test_invalid_utf8_found_in_every_string_position(threads: int) -> None:
    """Strings are checked after each range and the range decoded again string by string when
    one is bad: nullable strings, array items, map keys and values, union branches included."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "n", "type": ["null", "string"]},
        {"name": "a", "type": {"type": "array", "items": "string"}},
        {"name": "m", "type": {"type": "map", "values": "string"}},
        {"name": "u", "type": ["int", "string", "null"]},
        {"name": "r", "type": ["null", {"type": "record", "name": "In", "fields": [
            {"name": "s", "type": "string"}]}]}]}
    good = {"n": "é", "a": ["x"], "m": {"k": "v"}, "u": "w", "r": {"s": "z"}}
    ok = write(schema, [good])[0]
    bad_bytes = b"\xc3\x28"
    variants = [ok.replace(s.encode(), bad_bytes) for s in ("é",)]
    for text in ("x", "k", "v", "w", "z"):  # each a one-character string: length byte 0x02
        i = ok.index(text.encode(), 3)
        assert ok[i - 1] == 2
        variants.append(ok[: i - 1] + b"\x04" + bad_bytes + ok[i + 1 :])
    for bad in variants:
        messages = [ok] * 3000 + [bad] + [ok] * 50
        native, python = both(messages, schema, threads=threads)
        assert isinstance(python, str) and "invalid UTF-8" in python, python
        assert native == python
        unchecked = [decode_messages(messages, parse_schema(schema), threads=threads,
                                     validate_utf8=False, native=native)[0]
                     for native in (True, False)]
        assert unchecked[0].equals(unchecked[1])  # the bytes kept as they are, by both


@pytest.mark.parametrize("threads", [1, 2])
def test_reused_output_memory_never_changes_a_held_batch(threads: int) -> None:
    """Output blocks of 64 KiB and more are kept for the next calls once Arrow releases them:
    a batch still held keeps its values while later calls decode into released blocks."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "a", "type": {"type": "array", "items": "long"}}]}
    parsed = parse_schema(schema)

    def messages(tag: str) -> list[bytes]:
        return write(schema, [{"s": f"{tag}{i}" * 3, "a": [i, -i]} for i in range(20_000)])

    first, second = messages("a"), messages("b")
    held, _ = decode_messages(first, parsed, threads=threads, native=True)
    expected = held.to_pylist()
    for _ in range(3):  # each result dropped at once: its blocks go back for the next call
        again, _ = decode_messages(second, parsed, threads=threads, native=True)
        assert again.equals(decode_messages(second, parsed, native=False)[0])
        del again
    assert held.to_pylist() == expected


def test_strings_of_every_length_and_a_bad_byte_at_every_position() -> None:
    """Strings are copied in fixed 16/32/64-byte moves when the message has the bytes left, and
    checked for UTF-8 words at a time: every length across those bounds, at a message's end and
    before other fields, with a valid 2-byte character or an invalid byte at each position."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "t", "type": ["null", "string"]}]}
    parsed = parse_schema(schema)
    good, bad = [], []
    for n in range(0, 80):
        text = "q" * n  # odd as a byte: never a zigzag length
        good += write(schema, [{"s": text, "t": None}, {"s": "a", "t": text}])
        for k in range(0, n - 1, 3 if n > 40 else 1):
            good += write(schema, [{"s": text[:k] + "é" + text[k + 2:], "t": "é" * (n // 2)}])
            for invalid in (b"\xff", b"\xc3\x28", b"\xe2\x82"):
                raw = write(schema, [{"s": text, "t": text}])[0]
                cut = raw.index(b"q" * n) + k if n else 1
                bad.append(raw[:cut] + invalid[: n - k] + raw[cut + len(invalid[: n - k]):])
    native, python = both(good, schema, threads=2)
    assert_same(native, python)
    assert native[0].column("s").to_pylist()[:4] == ["", "a", "q", "a"]
    for message in bad:
        outcome = [None, None]
        for i, native_flag in enumerate((True, False)):
            try:
                decode_messages([message], parsed, native=native_flag)
            except AvroDecodeError as exc:
                outcome[i] = str(exc)
        assert outcome[0] == outcome[1], message
        assert outcome[0] is not None and "invalid UTF-8" in outcome[0], message


def test_small_batches_stay_on_one_thread_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By default a thread gets at least 1 MiB of input; a smaller batch decodes on the calling
    thread alone, to the same batch (and the same first error) as when it is split."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "m", "type": {"type": "map", "values": "int"}}]}
    messages = write(schema, [{"s": f"v{i}" * (i % 5), "m": {"k": i}} for i in range(3000)])
    parsed = parse_schema(schema)
    split, _ = decode_messages(messages, parsed, threads=2, native=True)
    bad = [*messages[:2000], b"\x02", *messages[2000:]]
    split_error = both(bad, schema, threads=2)[0]
    monkeypatch.setattr(codec, "_MIN_BYTES_PER_THREAD", 1 << 20)
    assert sum(map(len, messages)) < 1 << 20
    whole, _ = decode_messages(messages, parsed, threads=2, native=True)
    assert whole.equals(split)
    assert both(bad, schema, threads=2)[0] == split_error == "message 2000 at byte 0: " + (
        "truncated: string at s runs past the end of the data")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=schema_and_records(max_size=12), data=st.data())
def test_a_stream_of_blocks_decodes_like_decode_blocks(
    case: tuple[dict[str, Any], list[Any]], data: st.DataObject
) -> None:
    """Blocks fed one by one to the native stream give decode_blocks' batch, or None where
    decode_blocks raises (a flipped byte: bad structure or bad UTF-8 in any block)."""
    schema, records = case
    messages = write(schema, records)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(messages)), max_size=4)))
    bounds = list(zip([0, *cuts], [*cuts, len(messages)], strict=True))
    blocks = [(b"".join(messages[a:b]), b - a) for a, b in bounds]
    if data.draw(st.booleans()) and any(b for b, _ in blocks):
        i = data.draw(st.sampled_from([i for i, (b, _) in enumerate(blocks) if b]))
        body, count = blocks[i]
        j = data.draw(st.integers(0, len(body) - 1))
        body = body[:j] + bytes([body[j] ^ data.draw(st.integers(1, 255))]) + body[j + 1 :]
        blocks[i] = (body, count)
    try:
        expected = decode_blocks(blocks, schema, threads=1)
    except AvroDecodeError:
        expected = None
    step = data.draw(st.integers(1, 3))  # blocks per feed
    streamed = codec.decode_stream(
        (([b for b, _ in blocks[i : i + step]], [n for _, n in blocks[i : i + step]], 0)
         for i in range(0, len(blocks), step)), schema)
    if expected is None:
        assert streamed is None
    else:
        assert streamed is not None
        # a flipped byte of a float may make a NaN, which equals() holds unequal to itself
        assert streamed.equals(expected) or _nan_free(streamed.to_pylist()) == _nan_free(
            expected.to_pylist()
        )


def test_a_stream_sizes_its_buffers_from_a_guess_and_refuses_misuse() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "a", "type": {"type": "array", "items": "long"}}]}
    messages = write(schema, [{"s": f"é{i}", "a": list(range(i % 5))} for i in range(3000)])
    blocks = [(b"".join(messages[i : i + 100]), 100) for i in range(0, 3000, 100)]
    size = sum(len(b) for b, _ in blocks)
    for guess in (0, size // 10, size, size * 10):  # too small, right, too large: same batch
        fed = codec.decode_stream((([b], [n], guess) for b, n in blocks), schema)
        assert fed is not None and fed.equals(decode_blocks(blocks, schema))
    stream = codec._cdecode.BlockStream(codec._native_plan(parse_schema(schema)), True)
    assert stream.feed([blocks[0][0]], [100], 0)
    assert stream.finish() is not None
    with pytest.raises(RuntimeError, match="not ready"):
        stream.feed([blocks[1][0]], [100], 0)
    with pytest.raises(RuntimeError, match="not ready"):
        stream.finish()
    bad = codec._cdecode.BlockStream(codec._native_plan(parse_schema(schema)), True)
    assert not bad.feed([blocks[0][0][:-1]], [100], 0)  # truncated
    assert not bad.feed([blocks[1][0]], [100], 0)  # a good block after a bad one: still failed
    assert bad.finish() is None
    fresh = codec._cdecode.BlockStream(codec._native_plan(parse_schema(schema)), True)
    with pytest.raises(ValueError, match="negative"):
        fresh.feed([b""], [-1], 0)
    with pytest.raises(ValueError, match="one count per block"):
        fresh.feed([b"", b""], [0], 0)
    with pytest.raises(TypeError):
        fresh.feed([3], [1], 0)
    assert fresh.feed([], [], 0) and fresh.feed([b"", b""], [0, 0], 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_bad_utf8_far_into_a_range_is_found_by_the_periodic_check(threads: int) -> None:
    """Ranges past 32 KB are checked for UTF-8 every 32 KB as they are read: a bad string in any
    stretch (first, middle, last), alone or after a structural error, is reported like the
    pure-Python decoder reports it."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "long"}, {"name": "s", "type": "string"},
        {"name": "t", "type": {"type": "array", "items": "string"}}]}
    messages = write(schema, [{"n": i, "s": f"ü-{i:05d}-" + "x" * 40, "t": ["é" * (i % 4)]}
                              for i in range(4000)])
    for bad in (3, 1700, 3999):
        broken = list(messages)
        broken[bad] = broken[bad].replace("ü".encode(), b"\xc3\x28")  # not a continuation byte
        native, python = both(broken, schema, threads=threads)
        assert isinstance(python, str) and f"message {bad} " in python
        assert native == python
        earlier = list(broken)
        earlier[bad // 2] = earlier[bad // 2][:-1]  # a truncated message before it
        assert both(earlier, schema, threads=threads)[0] == both(earlier, schema)[1]
    native, python = both(messages, schema, threads=threads)
    assert_same(native, python)


def _huge_pages_on_request() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


_HUGE_PAGES_SCRIPT = """
import pyarrow as pa
from arrowstash.avro import decode, encode

def mapping_of(address):  # the /proc/self/smaps fields of the mapping holding address
    fields, inside = {}, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside:
                fields[head.rstrip(":")] = line.split(":", 1)[1].strip()
    return fields

schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
strings = pa.array([f"{i:07d}" * 40 for i in range(20_000)])  # 5.6 MB
batch = decode(encode(pa.record_batch([strings], names=["s"]), schema, threads=1), schema,
               threads=1)
for array in (batch.column(0), encode(batch, schema, threads=1)):
    for buffer in array.buffers()[1:]:
        print(buffer.size, buffer.address, mapping_of(buffer.address).get("THPeligible"))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or not _huge_pages_on_request(),
                    reason="no transparent huge pages here")
def test_large_outputs_lie_on_huge_pages() -> None:
    """Blocks of 2 MiB and more start on a 2 MiB boundary, smaller ones of 64 KiB and more on a
    64 KiB one, all in mappings the kernel may back with huge pages: a batch read long after it
    was written (any other work in between) then misses the TLB once per 2 MiB instead of once
    per 4 KiB page of every column. In a fresh process: a small block the pool later gives
    back to the system splits its region's mapping, and blocks still in the pieces may then
    lie on small pages (docs/avro.md)."""
    out = subprocess.run([sys.executable, "-c", _HUGE_PAGES_SCRIPT], capture_output=True,
                         text=True, timeout=120, check=True).stdout.split("\n")
    rows = [[int(x) if x.isdigit() else x for x in line.split()] for line in out if line]
    assert len(rows) == 4  # offsets and data of the decoded column, then of the messages
    for offsets, data in (rows[0:2], rows[2:4]):
        assert data[0] > 2 << 20 and (64 << 10) < offsets[0] < (2 << 20)
        assert data[1] % (2 << 20) == 0 and offsets[1] % (64 << 10) == 0
        assert data[2] == offsets[2] == 1, (data, offsets)


def test_held_outputs_never_share_memory_across_regions() -> None:
    """Batches held at once take more than one 32 MiB region of small blocks: each keeps its
    own values while later calls decode into the other blocks of the pool and the regions."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "a", "type": {"type": "array", "items": "long"}}]}
    records = [{"s": f"{i:06d}" * (1 + i % 3), "a": [i, -i][: i % 3]} for i in range(50_000)]
    messages = pa.array(write(schema, records), pa.binary())
    parsed = parse_schema(schema)
    held = [decode_messages(messages.slice(k * 500, 30_000), parsed, threads=1 + k % 2,
                            native=True)[0] for k in range(40)]  # over 32 MiB of small blocks
    for k in (0, 17, 39):
        assert held[k].slice(0, 200).to_pylist() == records[k * 500 : k * 500 + 200]
    for k, batch in enumerate(held):
        again, _ = decode_messages(messages.slice(k * 500, 30_000), parsed, native=True)
        assert batch.equals(again), k


_POOL_SCRIPT = """
import os, sys, time
import pyarrow as pa
from arrowstash.avro import decode

schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"},
                                                     {"name": "n", "type": "long"}]}
from arrowstash.avro.encoder import encode
records = [{"s": f"v{i}" * 20, "n": i} for i in range(60_000)]
messages = encode(pa.RecordBatch.from_pylist(records), schema, threads=1)
rows = decode(messages, schema, threads=1)


def tasks() -> int:
    # threads other than jemalloc's background ones, which Arrow's allocator starts when it
    # likes (more of them on a loaded machine)
    time.sleep(0.2)  # a helper that ends after a batch is gone by then
    names = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as comm:
            names.append(comm.read())
    return sum(not name.startswith("jemalloc") for name in names)


counts = [tasks()]
for _ in range(3):
    assert decode(messages, schema, threads=2).equals(rows)
    counts.append(tasks())
for _ in range(3):  # the encoder keeps its own
    assert encode(rows, schema, threads=2).equals(messages)
    counts.append(tasks())
print(*counts)
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:  # the parent's helpers are not here: the child starts its own
        ok = decode(messages, schema, threads=2).equals(rows)
        ok = ok and decode(messages, schema, threads=3).equals(rows)
        ok = ok and encode(rows, schema, threads=3).equals(messages)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child", os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        print("child hung")
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_helper_threads_are_kept_between_batches_and_not_inherited_by_a_fork() -> None:
    """The first two-thread batch starts a helper (rarely two), which then waits for the next batch
    instead of ending (one for the decoder, one for the encoder); a forked child (which has
    none of its parent's threads) decodes and encodes with helpers of its own."""
    out = subprocess.run([sys.executable, "-c", _POOL_SCRIPT, "fork"], capture_output=True,
                         text=True, timeout=120, check=True).stdout.split("\n")
    counts = [int(n) for n in out[0].split()]
    # a batch hands work to an idle helper, or starts one: on a loaded machine a helper may not
    # be idle again yet when the next piece comes, so a second one can start; none ever ends
    assert counts[0] < counts[1] <= counts[2] <= counts[3] <= counts[0] + 2, counts
    assert counts[3] < counts[4] <= counts[5] <= counts[6] <= counts[3] + 2, counts
    assert out[1] == "child 0", out


def test_batches_decoded_at_once_from_several_threads_share_the_helpers() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "s", "type": "string"}, {"name": "a", "type": {"type": "array", "items": "int"}}]}
    records = [{"s": f"{i}" * (i % 9), "a": list(range(i % 5))} for i in range(20_000)]
    messages = pa.array(write(schema, records), pa.binary())
    parsed = parse_schema(schema)
    expected, _ = decode_messages(messages, parsed, threads=1, native=True)
    results: list[bool] = []

    def work(threads: int) -> None:
        for _ in range(40):
            batch, _ = decode_messages(messages, parsed, threads=threads, native=True)
            results.append(batch.equals(expected))

    # more threads than cores: a helper often claims chunk 0 before the calling thread does
    workers = [threading.Thread(target=work, args=(2 + k % 3,)) for k in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert results == [True] * 240


def test_a_chunked_array_decodes_as_one_array_read_in_place() -> None:
    """A table's column is a ChunkedArray: its chunks (sliced, with a null message in a later
    one) decode as the one array they make, and the first bad message is named by its index
    in the whole column, as the pure-Python decoder names it."""
    schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
    messages: list[bytes | None] = list(write(schema, [{"s": f"v{i}"} for i in range(30)]))
    whole = pa.array(messages, pa.binary())
    chunked = pa.chunked_array([whole.slice(0, 7), whole.slice(7, 1), whole.slice(8)])
    assert both(chunked, schema) == both(whole, schema)
    assert both(pa.chunked_array([whole]), schema)[0][0].equals(both(whole, schema)[0][0])
    messages[12] = None
    broken = pa.array(messages, pa.binary())
    native, python = both(pa.chunked_array([broken.slice(0, 10), broken.slice(10)]), schema)
    assert native == python and "message 12 " in native
    many = pa.array(write(schema, [{"s": f"v{i}"} for i in range(20_000)]), pa.binary())
    column = pa.chunked_array([many.slice(0, 5_000), many.slice(5_000)])
    tracemalloc.start()
    try:
        decode_messages(column, parse_schema(schema), native=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200_000, peak  # no Python object per message (a memoryview each: ~4 MB)
