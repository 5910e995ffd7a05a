"""Avro <-> Arrow: arrowstash.avro against pyruhvro 0.4.0 and fastavro, in one run.

Run it from the repository root::

    python benchmarks/bench_avro.py [--quick] [--rounds N]

``--quick`` (20,000 records, fastavro on 5,000, 3 rounds) is for CI; the targets are defined on
100,000 records, so only the full run's verdicts count.

Schemas (written here; the data are generated from a seeded random.Random):

- ``userdata``: the shape of pyruhvro's own benchmark record (a Kafka-ish user profile): a string
  id, an int, a nested record of two strings, a nullable string, an array of strings, a boolean,
  a map of ints and a timestamp-millis. The generator's records average ~120 bytes, close to the
  118.5 bytes of the issue's measurement.
- ``events``: the harder, Kafka-like schema with logical types: uuid, timestamp-micros, date,
  decimal(12, 2), an enum, a nested record with a nullable field, an array of strings, a
  map<string, long> and nullable unions. pyruhvro panics on it (decimal and uuid): that is
  reported, not hidden.

Messages are written once with fastavro (the reference implementation) and given to every
decoder as a ``pyarrow.BinaryArray`` (fastavro reads the Python bytes). Contenders run
interleaved, once per round in a rotating order; tables show medians over the rounds, records/s
and MB/s of Avro bytes, and the issue's targets with PASS/FAIL:

- decode and encode at least 2x pyruhvro at the same thread count, on userdata, 100,000 records;
- near-linear scaling from 1 to 2 threads (taken as a speed-up of at least 1.7x), 100,000 records;
- at least 3x the arrow-avro reader's ~620 k records/s on the Kafka-like schema, i.e. 1.86 M
  records/s absolute (that figure was measured on another machine);
- reading an Object Container File at least 30x faster than fastavro's reader + from_pylist,
  measured on uncompressed and on deflate files, the same file (fastavro's, 16 kB blocks) for
  both readers; ours inflates with ISA-L when the ``isal`` package (the ``avro`` extra) is there.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import importlib.util
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa

from arrowstash.avro import parse_schema
from arrowstash.avro.codec import decode, native_available, native_inflate_available
from arrowstash.avro.encoder import encode
from arrowstash.avro.ocf import read_ocf

try:
    import pyruhvro
except ImportError:  # the bench group installs it; without it its columns say so
    pyruhvro = None

USERDATA = {
    "type": "record", "name": "UserData", "namespace": "bench",
    "fields": [
        {"name": "userId", "type": "string"},
        {"name": "age", "type": "int"},
        {"name": "fullName", "type": {"type": "record", "name": "FullName", "fields": [
            {"name": "firstName", "type": "string"}, {"name": "lastName", "type": "string"}]}},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "phoneNumbers", "type": {"type": "array", "items": "string"}},
        {"name": "isPremiumMember", "type": "boolean"},
        {"name": "favoriteItems", "type": {"type": "map", "values": "int"}},
        {"name": "registrationDate",
         "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

EVENTS = {
    "type": "record", "name": "Event", "namespace": "bench",
    "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind",
                                  "symbols": ["VIEW", "CLICK", "BUY", "REFUND"]}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 12, "scale": 2}},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counters", "type": {"type": "map", "values": "long"}},
        {"name": "referrer", "type": ["null", "string"], "default": None},
        {"name": "score", "type": ["null", "double"], "default": None},
    ],
}

FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Leslie"]
LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson"]
WORDS = ["red", "green", "blue", "sale", "new", "promo", "mobile", "web", "eu", "us", "beta"]
EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)

SPEEDUP = 2.0
SCALING = 1.7
KAFKA_RECORDS_PER_S = 3 * 620_000
OCF_SPEEDUP = 30.0


def userdata(rng: random.Random) -> dict[str, Any]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return {
        "userId": str(uuid.UUID(int=rng.getrandbits(128))),
        "age": rng.randrange(18, 90),
        "fullName": {"firstName": first, "lastName": last},
        "email": None if rng.random() < 0.2 else f"{first}.{last}@example.com".lower(),
        "phoneNumbers": [f"+1-555-{rng.randrange(10**7):07d}" for _ in range(rng.randrange(1, 4))],
        "isPremiumMember": rng.random() < 0.3,
        "favoriteItems": {f"item{rng.randrange(1000)}": rng.randrange(100)
                          for _ in range(rng.randrange(3))},
        "registrationDate": EPOCH + datetime.timedelta(milliseconds=rng.randrange(10**10)),
    }


def event(rng: random.Random) -> dict[str, Any]:
    at = EPOCH + datetime.timedelta(microseconds=rng.randrange(10**13))
    return {
        "id": uuid.UUID(int=rng.getrandbits(128)),
        "at": at,
        "day": at.date(),
        "kind": rng.choice(["VIEW", "CLICK", "BUY", "REFUND"]),
        "amount": decimal.Decimal(rng.randrange(-10**8, 10**8)).scaleb(-2),
        "user": {"id": rng.randrange(10**12), "name": rng.choice(FIRST),
                 "email": None if rng.random() < 0.5 else "someone@example.com"},
        "tags": rng.sample(WORDS, rng.randrange(4)),
        "counters": {w: rng.randrange(10**6) for w in rng.sample(WORDS, rng.randrange(3))},
        "referrer": None if rng.random() < 0.7 else "https://example.com/landing",
        "score": None if rng.random() < 0.5 else rng.random(),
    }


def messages(schema: dict[str, Any], records: list[dict[str, Any]]) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for record in records:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        out.append(buffer.getvalue())
    return out


# -- timing ------------------------------------------------------------------------------------

def interleaved(contenders: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float | str]:
    """Median seconds per contender (or the error that stopped it), run in rotating order."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    failed: dict[str, str] = {}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if name in failed:
                continue
            start = time.perf_counter()
            try:
                contenders[name]()
            except BaseException as exc:  # pyruhvro panics with a BaseException
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
                continue
            times[name].append(time.perf_counter() - start)
    return {name: failed.get(name) or statistics.median(times[name]) for name in names}


def table(title: str, results: dict[str, float | str], records: dict[str, int],
          per_record: float, baseline: str) -> None:
    """Markdown rows: median, records/s, MB/s of Avro (``per_record`` bytes each), ratio."""
    print(f"\n### {title}\n")
    print(f"| contender | records | median ms | records/s | MB/s | vs {baseline} |")
    print("|---|---:|---:|---:|---:|---:|")
    base = results.get(baseline)
    base_rate = records[baseline] / base if isinstance(base, float) else None
    for name, value in results.items():
        if isinstance(value, str):
            print(f"| {name} | {records[name]:,} | — | fails: {value} | — | — |")
            continue
        rate = records[name] / value
        ratio = f"{rate / base_rate:.2f}x" if base_rate else "—"
        print(f"| {name} | {records[name]:,} | {value * 1e3:,.1f} | {rate:,.0f} | "
              f"{rate * per_record / 1e6:,.0f} | {ratio} |")


def rate(results: dict[str, float | str], name: str, n: int) -> float | None:
    value = results.get(name)
    return n / value if isinstance(value, float) else None


def verdict(label: str, ok: bool | None, detail: str) -> None:
    status = "n/a" if ok is None else ("PASS" if ok else "FAIL")
    print(f"| {label} | {detail} | **{status}** |")


# -- benchmarks --------------------------------------------------------------------------------

def pyruhvro_batches(msgs: list[bytes], text: str) -> tuple[list[pa.RecordBatch] | None, str]:
    """pyruhvro's decode of ``msgs`` with fd 2 sent to /dev/null (a Rust panic prints its
    backtrace there before surfacing as an exception), and why it failed ("" if it did not)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        return pyruhvro.deserialize_array_threaded(msgs, text, 1), ""
    except BaseException as exc:  # a panic: ValueError, or PanicException (a BaseException)
        if isinstance(exc, KeyboardInterrupt):
            raise
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def bench_decode(name: str, schema: dict[str, Any], msgs: list[bytes], few: int,
                 rounds: int) -> dict[str, float | str]:
    text = json.dumps(schema)
    parsed = parse_schema(schema)
    array = pa.array(msgs, pa.binary())
    nbytes = sum(map(len, msgs))
    fa_schema = fastavro.parse_schema(schema)
    subset = msgs[:few]
    arrow_schema = parsed.arrow_schema

    def fastavro_decode() -> pa.Table:
        rows = [fastavro.schemaless_reader(io.BytesIO(m), fa_schema) for m in subset]
        return pa.Table.from_pylist(rows, schema=arrow_schema)

    contenders: dict[str, Callable[[], Any]] = {
        "arrowstash 1 thread": lambda: decode(array, parsed, threads=1),
        "arrowstash 2 threads": lambda: decode(array, parsed, threads=2),
    }
    refused = ""
    if pyruhvro is not None:
        _, refused = pyruhvro_batches(msgs, text)
    if pyruhvro is not None and not refused:
        deserialize = pyruhvro.deserialize_array_threaded
        contenders["pyruhvro 1 chunk"] = lambda: deserialize(msgs, text, 1)
        contenders["pyruhvro 2 chunks"] = lambda: deserialize(msgs, text, 2)
    contenders["fastavro + from_pylist"] = fastavro_decode
    results = interleaved(contenders, rounds)
    counts = {c: (few if c.startswith("fastavro") else len(msgs)) for c in contenders}
    table(f"decode, {name}, {len(msgs):,} records of {nbytes / len(msgs):.1f} bytes", results,
          counts, nbytes / len(msgs),
          "pyruhvro 1 chunk" if "pyruhvro 1 chunk" in contenders else "arrowstash 1 thread")
    if refused:
        print(f"\npyruhvro cannot decode this schema ({refused}): not measured.")
    return results


def bench_encode(name: str, schema: dict[str, Any], msgs: list[bytes],
                 records: list[dict[str, Any]], few: int, rounds: int) -> dict[str, float | str]:
    text = json.dumps(schema)
    parsed = parse_schema(schema)
    batch = decode(pa.array(msgs, pa.binary()), parsed)
    nbytes = sum(map(len, msgs))
    try:
        same: str = "yes" if encode(batch, parsed).to_pylist() == msgs else "NO"
    except Exception as exc:  # reported in the table below as well
        same = f"fails ({type(exc).__name__})"
    fa_schema = fastavro.parse_schema(schema)
    subset = records[:few]

    def fastavro_encode() -> list[bytes]:
        out = []
        for record in subset:
            buffer = io.BytesIO()
            fastavro.schemaless_writer(buffer, fa_schema, record)
            out.append(buffer.getvalue())
        return out

    contenders: dict[str, Callable[[], Any]] = {
        "arrowstash 1 thread": lambda: encode(batch, parsed, threads=1),
        "arrowstash 2 threads": lambda: encode(batch, parsed, threads=2),
    }
    if pyruhvro is not None:
        batches, _ = pyruhvro_batches(msgs, text)  # their decoder refusing is noted by decode's
        theirs = (None if batches is None
                  else pa.Table.from_batches(batches).combine_chunks().to_batches()[0])
        if theirs is not None:
            serialize = pyruhvro.serialize_record_batch
            contenders["pyruhvro 1 chunk"] = lambda: serialize(theirs, text, 1)
            contenders["pyruhvro 2 chunks"] = lambda: serialize(theirs, text, 2)
    contenders["fastavro schemaless_writer"] = fastavro_encode
    results = interleaved(contenders, rounds)
    counts = {c: (few if c.startswith("fastavro") else len(msgs)) for c in contenders}
    table(f"encode, {name}, {len(msgs):,} records", results, counts, nbytes / len(msgs),
          "pyruhvro 1 chunk" if "pyruhvro 1 chunk" in contenders else "arrowstash 1 thread")
    print(f"\narrowstash's messages byte-identical to fastavro's: {same}")
    return results


def _inflate_library() -> str:
    """Which raw inflate read_ocf uses: libdeflate in the native decoder where the system has
    it, else ISA-L when the ``isal`` package is installed, else zlib."""
    if native_inflate_available():
        return "libdeflate, native"
    return "ISA-L" if importlib.util.find_spec("isal") else "zlib"


def bench_ocf(schema: dict[str, Any], records: list[dict[str, Any]], few: int, rounds: int,
              folder: Path, codec: str) -> tuple[float | None, float | None]:
    """read_ocf vs fastavro's reader + from_pylist on a file fastavro wrote with ``codec``."""
    path = folder / f"userdata-{codec}.avro"
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(schema), records, codec=codec)
    small = folder / f"userdata-{codec}-small.avro"
    with open(small, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(schema), records[:few], codec=codec)
    arrow_schema = parse_schema(schema).arrow_schema

    def fastavro_read() -> pa.Table:
        with open(small, "rb") as f:
            return pa.Table.from_pylist(list(fastavro.reader(f)), schema=arrow_schema)

    results = interleaved({
        "arrowstash read_ocf": lambda: read_ocf(path),
        "arrowstash read_ocf, 1 thread": lambda: read_ocf(path, threads=1),
        "fastavro reader + from_pylist": fastavro_read,
    }, rounds)
    counts = {"arrowstash read_ocf": len(records), "arrowstash read_ocf, 1 thread": len(records),
              "fastavro reader + from_pylist": few}
    inflate = "" if codec != "deflate" else f" (our inflate: {_inflate_library()})"
    table(f"Object Container File read, userdata, {codec}{inflate}, "
          f"{path.stat().st_size:,} bytes",
          results, counts, path.stat().st_size / len(records), "fastavro reader + from_pylist")
    best = max(filter(None, (rate(results, "arrowstash read_ocf", len(records)),
                             rate(results, "arrowstash read_ocf, 1 thread", len(records)))),
               default=None)
    return best, rate(results, "fastavro reader + from_pylist", few)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="for CI: 20,000 records, fastavro on 5,000, 3 rounds")
    parser.add_argument("--rounds", type=int, help="rounds per measurement")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    big = 20_000 if args.quick else 100_000
    few = 5_000 if args.quick else 20_000  # fastavro's share: it is ~50x slower
    rng = random.Random(5)
    print(f"# Avro benchmark: Python {sys.version.split()[0]}, pyarrow {pa.__version__}, "
          f"fastavro {fastavro.__version__}, pyruhvro "
          f"{getattr(pyruhvro, '__version__', '0.4.0') if pyruhvro else 'not installed'}, "
          f"{len(os.sched_getaffinity(0))} cores, {rounds} rounds, arrowstash decoder: "
          f"{'native' if native_available() else 'pure Python (extension not built)'}")
    user_records = [userdata(rng) for _ in range(big)]
    user_msgs = messages(USERDATA, user_records)
    event_records = [event(rng) for _ in range(big)]
    event_msgs = messages(EVENTS, event_records)

    bench_decode("userdata", USERDATA, user_msgs[:10_000], min(few, 10_000), rounds)
    decoded = bench_decode("userdata", USERDATA, user_msgs, few, rounds)
    events = bench_decode("events (Kafka-like, logical types)", EVENTS, event_msgs, few, rounds)
    enc = bench_encode("userdata", USERDATA, user_msgs, user_records, few, rounds)
    bench_encode("events (Kafka-like, logical types)", EVENTS, event_msgs, event_records, few,
                 rounds)
    with tempfile.TemporaryDirectory() as folder:
        ocf = {codec: bench_ocf(USERDATA, user_records, few, rounds, Path(folder), codec)
               for codec in ("null", "deflate")}

    n = len(user_msgs)
    print("\n### Targets (issue 5)\n")
    print("| target | measured | |")
    print("|---|---|---|")
    for threads, chunks in ((1, "1 chunk"), (2, "2 chunks")):
        for label, results in (("decode", decoded), ("encode", enc)):
            ours = rate(results, f"arrowstash {threads} thread{'s' if threads > 1 else ''}", n)
            theirs = rate(results, f"pyruhvro {chunks}", n)
            ok = None if ours is None or theirs is None else ours >= SPEEDUP * theirs
            detail = (f"{ours / theirs:.2f}x pyruhvro ({ours:,.0f} vs {theirs:,.0f} rec/s)"
                      if ours and theirs else "not measured")
            verdict(f"{label} >= {SPEEDUP:g}x pyruhvro, {threads} thread(s), userdata {n:,}",
                    ok, detail)
    one, two = rate(decoded, "arrowstash 1 thread", n), rate(decoded, "arrowstash 2 threads", n)
    verdict(f"2-thread decode scaling >= {SCALING}x, userdata {n:,}",
            None if not (one and two) else two >= SCALING * one,
            f"{two / one:.2f}x" if one and two else "not measured")
    best = max(filter(None, (rate(events, "arrowstash 1 thread", len(event_msgs)),
                             rate(events, "arrowstash 2 threads", len(event_msgs)))), default=None)
    verdict(f"Kafka-like decode >= {KAFKA_RECORDS_PER_S:,} rec/s (3x arrow-avro's 620 k)",
            None if best is None else best >= KAFKA_RECORDS_PER_S,
            f"{best:,.0f} rec/s" if best else "not measured")
    for codec, (ours, theirs) in ocf.items():
        verdict(f"OCF read >= {OCF_SPEEDUP:g}x fastavro reader -> Arrow, {codec} codec",
                None if not (ours and theirs) else ours >= OCF_SPEEDUP * theirs,
                f"{ours / theirs:.1f}x" if ours and theirs else "not measured")

if __name__ == "__main__":
    main()
