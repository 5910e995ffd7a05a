"""The Avro fuzzing child of test_avro_stress.py, run in its own process so that a crash is seen as
a signal, not as the end of the test session, and its peak RSS is its own.

``python _avro_fuzz.py SECONDS SEED`` damages valid messages and container files of a few
schemas (flipped, cut, spliced, repeated and inserted bytes, huge varints, random bytes) for
SECONDS, decodes each batch with the native decoder on one and two threads and with the
pure-Python one, and prints one JSON object: calls, accepted and rejected inputs, errors of any
other type (with the first input that raised each), native and Python outcomes that differ, the
slowest input and the peak RSS.
"""

from __future__ import annotations

import io
import json
import random
import sys
import time
from functools import partial
from typing import Any

import fastavro
import pyarrow as pa

from arrowstash.avro import parse_schema, read_ocf
from arrowstash.avro.writer_decoder import decode_messages
from arrowstash.errors import ArrowstashError

ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "street", "type": "string"}, {"name": "city", "type": ["null", "string"]}]}
SCHEMAS: dict[str, Any] = {
    # the shape of pyruhvro's benchmark record: optional fields, arrays, maps, a 4-branch union
    "people": {"type": "record", "name": "Person", "fields": [
        {"name": "name", "type": ["null", "string"]},
        {"name": "age", "type": ["null", "int"]},
        {"name": "emails", "type": {"type": "array", "items": "string"}},
        {"name": "address", "type": ["null", ADDRESS]},
        {"name": "phones", "type": {"type": "map", "values": "string"}},
        {"name": "misc", "type": ["null", "string", "int", "boolean"]},
        {"name": "id", "type": "long"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}}]},
    "numbers": {"type": "record", "name": "N", "fields": [
        {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
        {"name": "b", "type": "boolean"}, {"name": "x", "type": {"type": "fixed", "name": "X",
                                                                 "size": 3}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                 "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}}]},
    "empty items": {"type": "record", "name": "E", "fields": [
        {"name": "nulls", "type": {"type": "array", "items": "null"}},
        {"name": "m", "type": {"type": "map", "values": {"type": "record", "name": "Z",
                                                         "fields": []}}}]},
    "linked list": {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]},
}


def record(name: str, rng: random.Random) -> dict[str, Any]:
    text = "".join(rng.choice("aé€𝄞 z") for _ in range(rng.randrange(12)))
    if name == "people":
        return {"name": rng.choice([None, text]), "age": rng.choice([None, rng.randrange(99)]),
                "emails": [text] * rng.randrange(4),
                "address": rng.choice([None, {"street": text, "city": rng.choice([None, "x"])}]),
                "phones": {f"k{i}": text for i in range(rng.randrange(4))},
                "misc": rng.choice([None, text, rng.randrange(-9, 9), True]),
                "id": rng.randrange(-2**62, 2**62), "kind": rng.choice("ABC")}
    if name == "numbers":
        import datetime as dt
        import decimal

        return {"f": rng.random(), "d": rng.random(), "b": rng.random() < 0.5,
                "x": rng.randbytes(3), "dec": decimal.Decimal(rng.randrange(-10**9, 10**9)) / 100,
                "ts": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
                + dt.timedelta(microseconds=rng.randrange(10**12))}
    if name == "empty items":
        return {"nulls": [None] * rng.randrange(5),
                "m": {f"{i}": {} for i in range(rng.randrange(3))}}
    node: dict[str, Any] | None = None
    for v in range(rng.randrange(20)):
        node = {"v": v, "next": node}
    return node or {"v": -1, "next": None}


def message(schema: Any, value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, value)
    return out.getvalue()


def damage(data: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    raw = bytearray(data)
    way = rng.randrange(7)
    if way == 0 and raw:  # flip bytes
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(len(raw))] ^= rng.randrange(1, 256)
    elif way == 1:  # cut
        del raw[rng.randrange(len(raw) + 1):]
    elif way == 2:  # splice with another
        other = rng.choice(others)
        raw = raw[: rng.randrange(len(raw) + 1)] + other[rng.randrange(len(other) + 1):]
    elif way == 3:  # a huge varint (a count or a length) somewhere
        at = rng.randrange(len(raw) + 1)
        raw[at:at] = bytes([0xFF] * rng.randrange(1, 10) + [rng.randrange(0x80)])
    elif way == 4 and raw:  # repeat a piece
        at = rng.randrange(len(raw))
        raw[at:at] = raw[at: at + rng.randrange(1, 32)] * rng.randrange(2, 50)
    elif way == 5:  # insert random bytes
        at = rng.randrange(len(raw) + 1)
        raw[at:at] = rng.randbytes(rng.randrange(1, 16))
    else:
        raw = bytearray(rng.randbytes(rng.randrange(64)))
    return bytes(raw)


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except ArrowstashError:
        return "rejected", None


def rows(batch: pa.RecordBatch) -> str:
    """The batch's rows as text: a NaN equals itself there, and a timestamp past Python's
    datetime range is its integer."""
    columns = [c.view(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in batch.columns]
    return repr(pa.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist())


def peak_rss() -> int:
    """This process's peak RSS in bytes: VmHWM, which starts afresh at exec (getrusage's
    ru_maxrss would carry over the test session's own peak, which forked this process)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def run(seconds: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    parsed = {name: parse_schema(schema) for name, schema in SCHEMAS.items()}
    valid = {name: [message(SCHEMAS[name], record(name, rng)) for _ in range(64)]
             for name in SCHEMAS}
    files = {}
    for name, schema in SCHEMAS.items():
        out = io.BytesIO()
        fastavro.writer(out, schema, [record(name, rng) for _ in range(200)],
                        codec=rng.choice(["null", "deflate"]), sync_interval=512)
        files[name] = out.getvalue()
    report: dict[str, Any] = {"calls": 0, "ok": 0, "rejected": 0, "wrong types": {},
                              "differ": 0, "first difference": None, "slowest s": 0.0,
                              "slowest input": ""}

    def timed(call: Any, shown: bytes) -> tuple[str, Any]:
        started = time.perf_counter()
        try:
            result = outcome(call)
        except Exception as exc:  # anything but our errors is a finding
            kind = type(exc).__name__
            report["wrong types"].setdefault(kind, f"{shown[:96].hex()} {exc!s:.200}")
            result = ("wrong", None)
        took = time.perf_counter() - started
        report["calls"] += 1
        if result[0] != "wrong":
            report[result[0]] += 1
        if took > report["slowest s"]:
            report["slowest s"], report["slowest input"] = took, shown[:96].hex()
        return result

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        name = rng.choice(list(SCHEMAS))
        if rng.random() < 0.2:  # a damaged container file, whose header is untrusted too
            data = damage(files[name], rng, list(files.values()))
            timed(partial(read_ocf, data, threads=rng.choice([1, 2])), data)
            continue
        batch = [damage(m, rng, valid[name]) if rng.random() < 0.3 else m
                 for m in rng.sample(valid[name], rng.randrange(1, 24))]
        shown, schema = b"|".join(batch), parsed[name]
        forms = {1: batch, 2: pa.array(batch, pa.binary())}  # a list, and an Arrow array
        outcomes = [timed(partial(decode_messages, forms[t], schema, threads=t, native=True),
                          shown) for t in (1, 2)]
        outcomes.append(timed(partial(decode_messages, batch, schema, native=False), shown))
        kinds = {kind for kind, _ in outcomes}
        values = {rows(value[0]) for kind, value in outcomes if kind == "ok"}
        if len(kinds) > 1 or len(values) > 1:
            report["differ"] += 1
            report["first difference"] = report["first difference"] or shown[:96].hex()
    report["peak RSS MB"] = peak_rss() / 2**20
    return report


if __name__ == "__main__":
    print(json.dumps(run(float(sys.argv[1]), int(sys.argv[2]))))
