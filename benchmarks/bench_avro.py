"""Avro <-> Arrow: arrowstash.avro against pyruhvro 0.4.0 and fastavro, side by side in one run.

Run it from the repository root::

    python benchmarks/bench_avro.py [--quick] [--rounds N] [--callgrind | --no-callgrind]

Every contender gets the same input object, and arrowstash and pyruhvro the same schema object
in every call: its JSON text, the form pyruhvro takes. Decoding: a Python ``list`` of ``bytes``,
one datum per message, as a Kafka client hands them over (pyruhvro takes nothing else); the
``pa.BinaryArray`` rows are arrowstash on another input form, for comparison. Encoding: one
record batch, pyruhvro's decode of the messages (its Arrow mapping, which arrowstash's encoder
also takes); the "own batch" row is arrowstash on its own decode's mapping. fastavro runs at its
best (``schemaless_reader`` / ``schemaless_writer`` with a parsed schema) on a share of the
messages, to and from Python dicts: it builds no Arrow data.

Workloads (benchmarks/_avro_data.py): pyruhvro's own benchmark schema, a flat schema, and our
``userdata`` and ``events``, each with ASCII strings and with strings mostly not ASCII.
Each table gives, per 100,000 messages, the median wall time, the median CPU time (all
threads of the process) and callgrind's instruction count (all threads; counted on fewer
messages and scaled, as the table says), then the ratios: pyruhvro's and fastavro's figure over
this row's (above 1: this row is faster). A last table decodes each workload again with every
call after a 20 ms sleep (untimed), as a consumer decodes after waiting for its next poll: the
other core has been idle, which changes where the system wakes a helper thread; another decodes
batches of 100, 500 and 5,000 messages (and a 200-field record's), where a call's fixed cost
shows. Targets
(issue 22) close the run with PASS/FAIL;
``--quick`` (20,000 messages, 5 rounds, no callgrind: for CI) reports them but never fails the
process, and only the full run's verdicts count (they are defined on 100,000 messages).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _avro_data import SCHEMAS, WIDE, messages, records
from _avro_measure import (
    Result,
    Timing,
    build_helper,
    count_child,
    interleaved,
    quiet_call,
    run_counts,
)
from _charts import chart, plot_option
from arrowstash.avro import parse_schema
from arrowstash.avro.decoder import decode, native_available
from arrowstash.avro.encoder import encode
from arrowstash.avro.ocf import read_ocf

try:
    import pyruhvro  # type: ignore[import-untyped]
except ImportError:  # the bench group installs it; without it its rows say so
    pyruhvro = None

DECODE_X = 2.0      # decode at least 2x pyruhvro, 1 and 2 threads
ENCODE_X = 1.5      # encode at least 1.5x pyruhvro
SCALING = 1.6       # 2 threads at least 1.6x 1 thread on a list of bytes
LIST_COST = 1.10    # the list of bytes at most 10% dearer than the BinaryArray
PAUSE = 0.02        # a consumer's wait between polls: the process sleeps this long before a call
KAFKA_RECORDS_PER_S = 3 * 620_000  # issue 5: 3x arrow-avro's reader on a Kafka-like schema
OCF_SPEEDUP = 30.0  # issue 5: container reads 30x fastavro's reader + from_pylist
PER = 100_000       # tables are per this many messages
US, PR, FA = "arrowstash", "pyruhvro", "fastavro"


def label(schema: str, unicode: bool) -> str:
    return f"{schema}, {'mostly non-ASCII' if unicode else 'ASCII'}"


# -- contenders -------------------------------------------------------------------------------

def decode_contenders(name: str, msgs: list[bytes], few: int) -> dict[str, Callable[[], Any]]:
    schema = SCHEMAS[name]
    text = json.dumps(schema)  # every contender's schema: the JSON text pyruhvro takes
    array = pa.array(msgs, pa.binary())
    fa_schema = fastavro.parse_schema(schema)
    subset = msgs[:few]
    out: dict[str, Callable[[], Any]] = {
        f"{US}, 1 thread": lambda: decode(msgs, text, threads=1),
        f"{US}, 2 threads": lambda: decode(msgs, text, threads=2),
        f"{US}, BinaryArray, 1 thread": lambda: decode(array, text, threads=1),
        f"{US}, BinaryArray, 2 threads": lambda: decode(array, text, threads=2),
    }
    if pyruhvro is not None:
        out[f"{PR}, 1 thread"] = lambda: pyruhvro.deserialize_array_threaded(msgs, text, 1)
        out[f"{PR}, 2 threads"] = lambda: pyruhvro.deserialize_array_threaded(msgs, text, 2)
    out[f"{FA} schemaless_reader"] = lambda: [
        fastavro.schemaless_reader(io.BytesIO(m), fa_schema) for m in subset]
    return out


def encode_input(name: str, msgs: list[bytes]) -> tuple[pa.RecordBatch, pa.RecordBatch, str]:
    """(the batch every encoder gets, arrowstash's own decode, what the first one is)."""
    ours = decode(msgs, parse_schema(SCHEMAS[name]), threads=1)
    if pyruhvro is None:
        return ours, ours, "arrowstash's decode (pyruhvro not installed)"
    batches, why = quiet_call(
        lambda: pyruhvro.deserialize_array_threaded(msgs, json.dumps(SCHEMAS[name]), 1))
    if batches is None:
        return ours, ours, f"arrowstash's decode (pyruhvro cannot decode it: {why})"
    theirs = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    return theirs, ours, "pyruhvro's decode"


def encode_contenders(name: str, msgs: list[bytes], rows: list[dict[str, Any]], few: int
                      ) -> tuple[dict[str, Callable[[], Any]], str]:
    schema = SCHEMAS[name]
    text = json.dumps(schema)
    batch, own, source = encode_input(name, msgs)
    fa_schema = fastavro.parse_schema(schema)
    subset = rows[:few]

    def fastavro_encode() -> list[bytes]:
        out = []
        for row in subset:
            buffer = io.BytesIO()
            fastavro.schemaless_writer(buffer, fa_schema, row)
            out.append(buffer.getvalue())
        return out

    out: dict[str, Callable[[], Any]] = {
        f"{US}, 1 thread": lambda: encode(batch, text, threads=1),
        f"{US}, 2 threads": lambda: encode(batch, text, threads=2),
        f"{US}, own batch, 1 thread": lambda: encode(own, text, threads=1),
    }
    if pyruhvro is not None:
        out[f"{PR}, 1 thread"] = lambda: pyruhvro.serialize_record_batch(batch, text, 1)
        out[f"{PR}, 2 threads"] = lambda: pyruhvro.serialize_record_batch(batch, text, 2)
    out[f"{FA} schemaless_writer"] = fastavro_encode
    return out, source


def contenders_of(name: str, msgs: list[bytes], rows: list[dict[str, Any]], few: int
                  ) -> tuple[dict[str, Callable[[], Any]], dict[str, int], str]:
    """Decode and encode contenders of one workload ("decode: ..." / "encode: ..."), how many
    messages each handles, and what the encoders get (``rows``: the first ``few`` records)."""
    dec = decode_contenders(name, msgs, few)
    enc, source = encode_contenders(name, msgs, rows, few)
    both = {f"decode: {k}": v for k, v in dec.items()} | {f"encode: {k}": v for k, v in enc.items()}
    counts = {k: (few if FA in k else len(msgs)) for k in both}
    return both, counts, source


# -- tables -----------------------------------------------------------------------------------

def ratio(theirs: float | None, ours: float | None) -> str:
    return f"{theirs / ours:.2f}x" if theirs and ours else "—"


def print_table(title: str, verb: str, results: dict[str, Result], counts: dict[str, int],
                instr: dict[str, float] | str, cg_n: int) -> None:
    """One Markdown table of ``verb``'s contenders, per PER messages (``instr``: instructions
    per message, counted on ``cg_n`` messages)."""
    def per(key: str, value: float | None) -> float | None:
        return None if value is None else value * 1e3 * PER / counts[key]

    def figures(key: str) -> tuple[float | None, float | None, float | None]:
        r = results.get(key)
        ins = instr.get(key) if isinstance(instr, dict) else None
        if not isinstance(r, Timing):
            return None, None, None if ins is None else ins * PER
        return per(key, r.wall), per(key, r.cpu), None if ins is None else ins * PER

    cg = f"M instr (callgrind, {cg_n:,} msgs, scaled)" if isinstance(instr, dict) else "M instr"
    print(f"\n### {verb} {title}\n")
    print(f"| contender | wall ms | CPU ms | {cg} | {PR} ÷ this: wall | CPU | instr "
          f"| {FA} ÷ this: wall | CPU | instr |")
    print("|---|" + "---:|" * 9)
    fa_key = next((k for k in results if k.startswith(f"{verb}: {FA}")), "")
    fa = figures(fa_key) if fa_key else (None, None, None)
    for key, r in results.items():
        if not key.startswith(f"{verb}: "):
            continue
        wall, cpu, ins = figures(key)
        name = key.split(": ", 1)[1]
        if isinstance(r, str):
            print(f"| {name} | fails: {r} |" + " |" * 8)
            continue
        pr = figures(f"{verb}: {PR}, {'2 threads' if '2 threads' in key else '1 thread'}")
        mine = (wall, cpu, ins)
        peer = " | ".join("—" if name.startswith(PR) else ratio(a, b)
                          for a, b in zip(pr, mine, strict=True))
        fas = " | ".join("—" if name.startswith(FA) else ratio(a, b)
                         for a, b in zip(fa, mine, strict=True))
        cells = [f"{v:,.1f}" if v is not None else "—" for v in (wall, cpu)]
        cells.append(f"{ins / 1e6:,.0f}" if ins is not None else "—")
        print(f"| {name} | {' | '.join(cells)} | {peer} | {fas} |")
    if isinstance(instr, str):
        print(f"\ncallgrind: {instr}")


# -- targets ----------------------------------------------------------------------------------

Verdict = tuple[str, str, bool | None]  # target, measured, PASS/FAIL (None: not measured)


def speed(results: dict[str, Result], key: str) -> Timing | None:
    r = results.get(key)
    return r if isinstance(r, Timing) else None


def scaling(what: str, one: Timing | None, two: Timing | None) -> Verdict:
    """Two threads at least SCALING times one (``what``: which decodes, after the target)."""
    target = f"2 threads >= {SCALING}x 1 thread{what}"
    if one is None or two is None:
        return target, "not measured", None
    return target, f"{one.wall / two.wall:.2f}x", one.wall >= SCALING * two.wall


def workload_targets(title: str, results: dict[str, Result]) -> list[Verdict]:
    """The issue's targets on one workload (wall time decides; CPU time is shown beside)."""
    out: list[Verdict] = []
    for verb, want in (("decode", DECODE_X), ("encode", ENCODE_X)):
        for t in ("1 thread", "2 threads"):
            ours = speed(results, f"{verb}: {US}, {t}")
            theirs = speed(results, f"{verb}: {PR}, {t}")
            target = f"{verb} >= {want:g}x {PR}, {t}, {title}"
            if ours is None or theirs is None:
                out.append((target, "not measured (a contender fails)", None))
                continue
            measured = f"{theirs.wall / ours.wall:.2f}x wall, {theirs.cpu / ours.cpu:.2f}x CPU"
            out.append((target, measured, theirs.wall >= want * ours.wall))
    one = speed(results, f"decode: {US}, 1 thread")
    two = speed(results, f"decode: {US}, 2 threads")
    if one and two:
        out.append(scaling(f", list of bytes, {title}", one, two))
    for t in ("1 thread", "2 threads"):
        lst = speed(results, f"decode: {US}, {t}")
        arr = speed(results, f"decode: {US}, BinaryArray, {t}")
        if lst and arr:
            out.append((f"list of bytes <= {LIST_COST:.2f}x BinaryArray, {t}, {title}",
                        f"{lst.wall / arr.wall:.2f}x wall, {lst.cpu / arr.cpu:.2f}x CPU",
                        lst.wall <= LIST_COST * arr.wall))
    return out


def summary_row(title: str, results: dict[str, Result], instr: dict[str, float] | str) -> str:
    """One line of the summary: pyruhvro's figure over ours (wall / CPU / instructions)."""
    def cell(verb: str, t: str) -> str:
        ours, theirs = speed(results, f"{verb}: {US}, {t}"), speed(results, f"{verb}: {PR}, {t}")
        if ours is None or theirs is None:
            return "—"
        a, b = f"{verb}: {US}, {t}", f"{verb}: {PR}, {t}"
        ins = (f" / {instr[b] / instr[a]:.2f}"
               if isinstance(instr, dict) and a in instr and b in instr else "")
        return f"{theirs.wall / ours.wall:.2f} / {theirs.cpu / ours.cpu:.2f}{ins}"

    one, two = speed(results, f"decode: {US}, 1 thread"), speed(results, f"decode: {US}, 2 threads")
    arr = speed(results, f"decode: {US}, BinaryArray, 1 thread")
    scaling = f"{one.wall / two.wall:.2f}x" if one and two else "—"
    cost = f"{one.wall / arr.wall:.2f}x / {one.cpu / arr.cpu:.2f}x" if one and arr else "—"
    cells = [cell(v, t) for v in ("decode", "encode") for t in ("1 thread", "2 threads")]
    return f"| {title} | {' | '.join(cells)} | {scaling} | {cost} |"


def print_summary(rows: list[str]) -> None:
    print(f"\n### Summary: {PR}'s figure ÷ arrowstash's (wall / CPU / instructions), "
          "list of bytes\n")
    print("| workload | decode 1 thread | decode 2 threads | encode 1 thread | encode 2 threads "
          "| decode 2 threads ÷ 1 | list ÷ BinaryArray, 1 thread (wall / CPU) |")
    print("|---|" + "---:|" * 6)
    for row in rows:
        print(row)


def print_verdicts(verdicts: list[Verdict]) -> int:
    print("\n### Targets (issue 22; issue 5's last two)\n")
    print("| target | measured | |")
    print("|---|---|---|")
    for target, measured, ok in verdicts:
        status = "n/a" if ok is None else "PASS" if ok else "FAIL"
        print(f"| {target} | {measured} | **{status}** |")
    fails = sum(1 for *_, ok in verdicts if ok is False)
    print(f"\n{sum(1 for *_, ok in verdicts if ok)} PASS, {fails} FAIL")
    return fails


# -- after a pause ----------------------------------------------------------------------------

def paused(w: Workload, msgs: list[bytes], rounds: int) -> tuple[str, Verdict]:
    """Decode with 1 and 2 threads, ours and pyruhvro's, each call after the process slept
    PAUSE seconds: as a consumer calls it between polls, with the other core idle meanwhile.
    Returns a summary row and the scaling target's verdict."""
    every = decode_contenders(w[0], msgs, 1)
    names = [f"{who}, {t}" for who in (US, PR) for t in ("1 thread", "2 threads")]
    results = interleaved({k: every[k] for k in names if k in every}, rounds, PAUSE)
    per = PER / len(msgs) * 1e3
    cells = []
    for who in (US, PR):
        one, two = speed(results, f"{who}, 1 thread"), speed(results, f"{who}, 2 threads")
        if one and two:
            cells += [f"{one.wall * per:.1f} / {one.cpu * per:.1f}",
                      f"{two.wall * per:.1f} / {two.cpu * per:.1f}", f"{one.wall / two.wall:.2f}x"]
        else:
            cells += ["—", "—", "—"]
    ours, theirs = speed(results, f"{US}, 2 threads"), speed(results, f"{PR}, 2 threads")
    cells.append(ratio(theirs.wall if theirs else None, ours.wall if ours else None))
    verdict = scaling(f" after a {PAUSE * 1e3:.0f} ms pause, list of bytes, {label(*w)}",
                      speed(results, f"{US}, 1 thread"), ours)
    return f"| {label(*w)} | {' | '.join(cells)} |", verdict


def print_paused(rows: list[str]) -> None:
    print(f"\n### Decode after a {PAUSE * 1e3:.0f} ms pause, list of bytes: wall / CPU ms per "
          f"{PER:,} messages\n")
    print(f"Each call follows a {PAUSE * 1e3:.0f} ms sleep (untimed), as a consumer's decode "
          "follows its wait for the next poll; the other core is idle meanwhile.\n")
    print(f"| workload | {US} 1 thread | {US} 2 threads | 2 ÷ 1 | {PR} 1 thread "
          f"| {PR} 2 threads | 2 ÷ 1 | {PR} ÷ {US}, 2 threads (wall) |")
    print("|---|" + "---:|" * 7)
    for row in rows:
        print(row)


# -- small batches ----------------------------------------------------------------------------

SMALL = (100, 500, 5_000)  # a consumer's poll (Kafka clients' max.poll.records: 500)


def repeated(fn: Callable[[], Any], k: int) -> Callable[[], None]:
    def calls() -> None:
        for _ in range(k):
            fn()
    return calls


def per_batch(t: Timing | None, k: int, why: str) -> str:
    return f"{t.wall / k * 1e6:,.1f} / {t.cpu / k * 1e6:,.1f}" if t else f"fails: {why}"


def small_batches(rounds: int) -> list[str]:
    """Decode with one thread on batches of SMALL messages, ours and pyruhvro's, each schema
    with ASCII text and a 200-field record: the fixed cost of a call, which the 100,000-message
    tables hide. A call is timed as a loop of calls worth ~20,000 messages. Returns the table's
    lines."""
    lines = ["\n### Small batches: decode, 1 thread, list of bytes, µs per batch (wall / CPU)\n",
             f"| workload | messages | {US} | {PR} | {PR} ÷ {US} (wall / CPU) |",
             "|---|---:|---:|---:|---:|"]
    for name, schema in {**SCHEMAS, "wide (200 fields)": WIDE}.items():
        all_msgs = messages(schema, records(name.split()[0], False, max(SMALL)))
        text = json.dumps(schema)
        for n in SMALL:
            msgs, k = all_msgs[:n], max(1, 20_000 // n)
            contenders = {US: repeated(functools.partial(decode, msgs, text, threads=1), k)}
            if pyruhvro is not None:
                contenders[PR] = repeated(
                    functools.partial(pyruhvro.deserialize_array_threaded, msgs, text, 1), k)
            results = interleaved(contenders, rounds)
            us, pr = speed(results, US), speed(results, PR)
            x = f"{pr.wall / us.wall:.2f}x / {pr.cpu / us.cpu:.2f}x" if us and pr else "—"
            why = str(results.get(PR, "not installed"))
            lines.append(f"| {name}, ASCII | {n:,} | {per_batch(us, k, why)} "
                         f"| {per_batch(pr, k, why)} | {x} |")
    return lines


# -- container files (issue 5) ----------------------------------------------------------------

def bench_ocf(n: int, few: int, rounds: int, folder: Path, codec: str) -> Verdict:
    """read_ocf vs fastavro's reader + from_pylist, on a userdata file fastavro wrote."""
    rows = records("userdata", False, n)
    parsed = fastavro.parse_schema(SCHEMAS["userdata"])
    path, small = folder / f"{codec}.avro", folder / f"{codec}-small.avro"
    for file, part in ((path, rows), (small, rows[:few])):
        with open(file, "wb") as out:
            fastavro.writer(out, parsed, part, codec=codec)
    arrow_schema = parse_schema(SCHEMAS["userdata"]).arrow_schema

    def fastavro_read() -> pa.Table:
        with open(small, "rb") as f:
            return pa.Table.from_pylist(list(fastavro.reader(f)), schema=arrow_schema)

    results = interleaved({"read_ocf": lambda: read_ocf(path), "fastavro": fastavro_read}, rounds)
    ours, theirs = speed(results, "read_ocf"), speed(results, "fastavro")
    target = f"container read >= {OCF_SPEEDUP:g}x fastavro reader + from_pylist, {codec}"
    if ours is None or theirs is None:
        return target, "not measured", None
    x = (theirs.wall / few) / (ours.wall / n)
    return target, (f"{x:.1f}x ({ours.wall * 1e3:.1f} ms for {n:,} records, CPU "
                    f"{ours.cpu * 1e3:.1f} ms)"), x >= OCF_SPEEDUP


# -- callgrind --------------------------------------------------------------------------------

Workload = tuple[str, bool]  # schema, mostly non-ASCII


def counts_of(data: dict[Workload, list[bytes]], few: int, root: Path
              ) -> dict[Workload, dict[str, float] | str]:
    """Instructions per message of every contender, per workload, from callgrind children given
    the same messages (two at a time: the counts do not depend on the load)."""
    helper = build_helper(root)
    if not helper:
        return dict.fromkeys(data, "skipped: valgrind, its header or a C compiler is missing")
    script = str(Path(__file__).resolve())

    def one(w: Workload) -> dict[str, float] | str:
        path = root / f"msgs-{w[0]}-{int(w[1])}.pickle"
        path.write_bytes(pickle.dumps(data[w]))
        got = run_counts([script, "--_cg", w[0], str(path), str(few), helper],
                         root / f"cg-{w[0]}-{int(w[1])}", 3600.0)
        if isinstance(got, str):
            return got
        return {k: v / (few if FA in k else len(data[w])) for k, v in got.items()}

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(data, pool.map(one, data), strict=True))


def cg_main(argv: list[str]) -> None:
    """The callgrind child: ``--_cg schema messages.pickle few helper``."""
    name, path, few, helper = argv
    msgs = pickle.loads(Path(path).read_bytes())
    fa_schema = fastavro.parse_schema(SCHEMAS[name])
    rows: list[dict[str, Any]] = [fastavro.schemaless_reader(io.BytesIO(m), fa_schema)  # type: ignore[misc]
                                  for m in msgs[: int(few)]]
    contenders, *_ = contenders_of(name, msgs, rows, int(few))
    count_child(contenders, helper)


# -- main -------------------------------------------------------------------------------------

def measure_workload(w: Workload, msgs: list[bytes], rows: list[dict[str, Any]], rounds: int
                     ) -> tuple[dict[str, Result], dict[str, int], str]:
    """Every contender of one workload, interleaved: (results, messages each handles, what the
    encoders get)."""
    contenders, counts, source = contenders_of(w[0], msgs, rows, len(rows))
    return interleaved(contenders, rounds), counts, source


def report_workload(w: Workload, msgs: list[bytes], few: int,
                    measured: tuple[dict[str, Result], dict[str, int], str],
                    instr: dict[str, float] | str, plot: str | None = None) -> list[Verdict]:
    """One workload's tables and charts, and its targets' verdicts."""
    name, (results, counts, source) = w[0], measured
    size = sum(map(len, msgs)) / len(msgs)
    title = label(*w)
    head = f"{title}: {len(msgs):,} messages of {size:.1f} bytes on average, per {PER:,}"
    print_table(head, "decode", results, counts, instr, len(msgs))
    print_table(head, "encode", results, counts, instr, len(msgs))
    for verb in ("decode", "encode"):
        timed = {key: r for key, r in results.items()
                 if key.startswith(f"{verb}: ") and isinstance(r, Timing)}
        chart(plot, f"avro_{verb}_{name}_{'non_ascii' if w[1] else 'ascii'}",
              f"{verb} {title}, per {PER:,} messages (medians)",
              [key.split(": ", 1)[1] for key in timed],
              {"wall": [r.wall * PER / counts[key] for key, r in timed.items()],
               "CPU": [r.cpu * PER / counts[key] for key, r in timed.items()]})
    print(f"\nEncoders' input: {source}. fastavro ran on {few:,} messages.")
    same = encode(decode(msgs, parse_schema(SCHEMAS[name]), threads=1), SCHEMAS[name])
    print(f"arrowstash's encode of its decode is byte-identical to fastavro's messages: "
          f"{'yes' if same.to_pylist() == msgs else 'NO'}")
    return workload_targets(title, results)


def events_rate(results: dict[str, Result], n: int) -> Verdict:
    best = min((r.wall for k, r in results.items()
                if k.startswith(f"decode: {US}") and isinstance(r, Timing)), default=None)
    rate = None if best is None else n / best
    return (f"Kafka-like (events, ASCII) decode >= {KAFKA_RECORDS_PER_S:,} rec/s",
            f"{rate:,.0f} rec/s" if rate else "not measured",
            None if rate is None else rate >= KAFKA_RECORDS_PER_S)


def stolen_seconds() -> float | None:
    """Seconds of steal time so far, all cores (/proc/stat; None elsewhere): on a virtual
    machine, time the host ran something else while this guest wanted the CPU, which moves
    wall times (and two-thread ratios most) without any change in the code."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="for CI: 20,000 messages, 5 rounds, no callgrind; never fails")
    parser.add_argument("--rounds", type=int, help="rounds per measurement")
    parser.add_argument("--callgrind", action=argparse.BooleanOptionalAction, default=None,
                        help="count instructions (default: on in the full run)")
    parser.add_argument("--only", choices=list(SCHEMAS), help="run only this schema")
    plot_option(parser)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    rounds = args.rounds or (5 if args.quick else 9)
    n = 20_000 if args.quick else 100_000
    few = 2_000 if args.quick else 10_000  # fastavro's share: it is ~50x slower
    print(f"# Avro benchmark: Python {sys.version.split()[0]}, pyarrow {pa.__version__}, "
          f"fastavro {fastavro.__version__}, pyruhvro "
          f"{'0.4.0' if pyruhvro else 'not installed'}, {len(os.sched_getaffinity(0))} cores, "
          f"{rounds} rounds, {n:,} messages, arrowstash decoder: "
          f"{'native' if native_available() else 'pure Python (extension not built)'}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    steal = stolen_seconds()
    start = time.perf_counter()
    data: dict[Workload, list[bytes]] = {}
    firsts: dict[Workload, list[dict[str, Any]]] = {}
    for w in ((s, u) for s in SCHEMAS for u in (False, True) if args.only in (None, s)):
        rows = records(*w, n)
        data[w], firsts[w] = messages(SCHEMAS[w[0]], rows), rows[:few]
    # every timing first, then the instruction counts: two callgrind children at once kept both
    # cores busy for two minutes, and the timings taken after that ran slower (the host gave
    # the guest less time: steal), two-thread ones most
    measured = {w: measure_workload(w, msgs, firsts[w], rounds) for w, msgs in data.items()}
    verdicts: list[Verdict] = []
    pauses: list[str] = []
    for w, msgs in data.items():
        row, verdict = paused(w, msgs, rounds)
        pauses.append(row)
        verdicts.append(verdict)
    small = small_batches(rounds) if args.only is None else []
    with tempfile.TemporaryDirectory() as folder:
        if args.only is None:
            verdicts += [bench_ocf(n, few, rounds, Path(folder), c) for c in ("null", "deflate")]
        count = args.callgrind if args.callgrind is not None else not args.quick
        instr = (counts_of(data, few, Path(folder)) if count
                 else dict.fromkeys(data, "not run (--quick or --no-callgrind)"))
    summary: list[str] = []
    for w, msgs in data.items():
        verdicts += report_workload(w, msgs, few, measured[w], instr[w], args.plot)
        summary.append(summary_row(label(*w), measured[w][0], instr[w]))
        if w == ("events", False):
            verdicts.append(events_rate(measured[w][0], n))
    print_summary(summary)
    print_paused(pauses)
    for line in small:
        print(line)
    print_verdicts(verdicts)
    if steal is not None and (now := stolen_seconds()) is not None:
        print(f"\nCPU time the hypervisor gave other guests during the run (steal, all cores): "
              f"{now - steal:.1f} s")
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.perf_counter() - start:.0f} s. Missed targets are reported, never an exit "
          "status: the verdicts are read from the tables.")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--_cg"]:
        cg_main(sys.argv[2:])
    else:
        main()
