"""``arrowstash avro decode | encode | cat``: Avro messages and files from the command line.

Message files hold one message after another, each preceded by its length as a 4-byte
big-endian integer: what ``kcat -C -t TOPIC -f '%R%s'`` writes, and what ``encode`` writes. A
Parquet or Arrow file with a binary column (``--column``, default ``value``) works as input
too, e.g. a topic dumped by a Kafka Connect sink. Tables go to Parquet, Arrow IPC or CSV,
chosen by the output's extension; an ``.avro`` output of ``encode`` is an Object Container
File. pyarrow is imported only when one of these commands runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from arrowstash.cli._output import progress, working

CHUNK = 100_000  # messages decoded or encoded per step (progress is reported per step)
PARQUET_ROW_GROUP = 1 << 20  # rows per Parquet row group: pyarrow's default, one step each
TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc", ".csv")
FRAMINGS = ("confluent", "apicurio", "single-object")  # the wire headers --framing knows
OCF_MAGIC = b"Obj\x01"  # the first bytes of every Object Container File


def register(sub: Any) -> None:
    """Add the ``avro`` command and its subcommands to the main parser's subparsers."""
    avro = sub.add_parser(
        "avro", help="decode, encode and show Avro messages and files",
        description="Avro from the command line: message files (each message after its 4-byte "
                    "big-endian length, as kcat -f '%R%s' writes) and Object Container Files, "
                    "to and from Parquet, Arrow, CSV and JSON lines.")
    commands = avro.add_subparsers(dest="avro_command", required=True)
    _add_decode(commands)
    _add_encode(commands)
    _add_convert_and_cat(commands)


def _add_decode(commands: Any) -> None:
    decode = commands.add_parser(
        "decode", help="Avro messages -> a table (Parquet, Arrow or CSV)",
        description="Decode a file of length-prefixed messages (kcat -f '%R%s'), or a "
                    "Parquet/Arrow file's binary column, into a table. For an Object Container "
                    "File (.avro) use 'arrowstash avro convert'.")
    decode.add_argument("input", type=Path, help="messages file, or .parquet/.arrow with a "
                                                  "binary column")
    decode.add_argument("-o", "--output", type=Path, required=True,
                        help="output table: .parquet, .arrow/.feather/.ipc or .csv")
    decode.add_argument("--schema", type=Path, required=True, help="writer schema (.avsc)")
    decode.add_argument("--reader-schema", type=Path, help="resolve to this schema (.avsc)")
    framed = decode.add_mutually_exclusive_group()
    framed.add_argument("--confluent", action="store_true",
                        help="messages carry the Confluent header (0x00 + 4-byte schema id)")
    framed.add_argument("--framing", choices=FRAMINGS, metavar="FRAMING",
                        help="strip and check this wire header: " + ", ".join(FRAMINGS))
    decode.add_argument("--column", default="value", help="binary column of a table input")
    decode.add_argument("--threads", type=int, help="decoding threads (default: all cores)")
    decode.set_defaults(run=cmd_decode)


def _add_encode(commands: Any) -> None:
    encode = commands.add_parser(
        "encode", help="a table -> Avro messages or an Object Container File",
        description="Encode a Parquet, Arrow or CSV table as length-prefixed Avro messages, "
                    "or as an Object Container File when the output ends in .avro.")
    encode.add_argument("input", type=Path, help="table: .parquet, .arrow/.feather/.ipc, .csv")
    encode.add_argument("-o", "--output", type=Path, required=True,
                        help=".avro for a container file, anything else for messages")
    encode.add_argument("--schema", type=Path,
                        help="writer schema (.avsc; default: derived from the table)")
    encode.add_argument("--framing", choices=FRAMINGS, metavar="FRAMING",
                        help="prefix every message with this wire header: " + ", ".join(FRAMINGS))
    encode.add_argument("--schema-id", type=int,
                        help="the registry id for --framing confluent/apicurio")
    encode.add_argument("--codec", default="zstd",
                        help="container codec: null, deflate, snappy, zstd, bzip2, xz")
    encode.add_argument("--schema-out", type=Path,
                        help="write the writer schema here (default: beside a messages output, "
                             "as OUTPUT.avsc, when the schema was derived)")
    encode.set_defaults(run=cmd_encode)


def _add_convert_and_cat(commands: Any) -> None:
    convert = commands.add_parser(
        "convert", help="an Object Container File -> Parquet, Arrow, CSV or JSON lines",
        description="Read an Avro Object Container File into a table and write it as Parquet, "
                    "Arrow IPC, CSV or JSON lines, chosen by the output's extension.")
    convert.add_argument("input", type=Path, help="Object Container File (.avro)")
    convert.add_argument("-o", "--output", type=Path, required=True,
                         help="output: .parquet, .arrow/.feather/.ipc, .csv or .jsonl")
    convert.set_defaults(run=cmd_convert)

    cat = commands.add_parser(
        "cat", help="show an Object Container File's header and first rows",
        description="Show an Object Container File's codec, record count, schema and user "
                    "metadata, then its first rows as a table.")
    cat.add_argument("file", type=Path, help="Object Container File (.avro)")
    cat.add_argument("-n", "--rows", type=int, default=10, help="rows to show")
    cat.set_defaults(run=cmd_cat)


# -- message files -----------------------------------------------------------------------------

def _length_prefixed() -> Any:
    import pyarrow as pa

    from arrowstash.avro.framing import Framing

    return Framing("length-prefixed", b"", 4, ">u4", pa.uint32(), "length")


def read_messages(path: Path, column: str = "value") -> Any:
    """The messages of ``path`` as a BinaryArray (see the module's docstring for formats)."""
    import pyarrow as pa

    from arrowstash.avro.framing import strip_header
    from arrowstash.errors import AvroDecodeError

    if path.suffix in TABLE_SUFFIXES:
        table = read_table(path)
        if column not in table.column_names:
            raise ValueError(f"{path} has no column {column!r}; it has {table.column_names}")
        messages = table.column(column).combine_chunks()
        if not (pa.types.is_binary(messages.type) or pa.types.is_large_binary(messages.type)):
            raise ValueError(f"column {column!r} of {path} is {messages.type}, not binary")
        return messages
    data = path.read_bytes()
    if data.startswith(OCF_MAGIC):
        raise ValueError(f"{path} is an Avro Object Container File, not a file of messages: "
                         f"read it with 'arrowstash avro convert {path} -o OUT.parquet' "
                         "(or 'avro cat')")
    starts: list[int] = []
    pos = 0
    while pos < len(data):  # walking the prefixes: each length says where the next one is
        if pos + 4 > len(data):
            raise AvroDecodeError(f"{path}: message {len(starts)} at byte {pos}: the file ends "
                                  "inside its 4-byte length prefix")
        starts.append(pos)
        pos += 4 + struct.unpack_from(">I", data, pos)[0]
    if pos > len(data):
        raise AvroDecodeError(f"{path}: message {len(starts) - 1} at byte {starts[-1]}: its "
                              f"length runs {pos - len(data)} bytes past the end of the file")
    return strip_header((data, [*starts, len(data)]), _length_prefixed()).payloads


def write_messages(path: Path, messages: Any) -> None:
    import pyarrow.compute as pc

    from arrowstash.avro.framing import add_header

    lengths = pc.binary_length(messages)
    framed = add_header(messages, _length_prefixed(), lengths)
    with open(path, "wb") as out:
        out.write(framed.buffers()[2] or b"")


# -- tables ------------------------------------------------------------------------------------

def read_table(path: Path) -> Any:
    import pyarrow as pa

    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if path.suffix == ".csv":
        import pyarrow.csv

        return pyarrow.csv.read_csv(path)
    if path.suffix in (".arrow", ".feather", ".ipc"):
        with pa.memory_map(str(path)) as source:
            try:
                return pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                return pa.ipc.open_stream(source).read_all()
    raise ValueError(f"{path}: unknown table format; use .parquet, .arrow/.feather/.ipc or .csv")


def write_table(path: Path, table: Any) -> None:
    """Write ``table`` in the format ``path``'s extension names, a slice at a time (a progress
    bar on a terminal: writing a large table is most of a conversion's time)."""
    import pyarrow as pa

    step = PARQUET_ROW_GROUP if path.suffix == ".parquet" else CHUNK
    starts = range(0, max(table.num_rows, 1), step)  # an empty table is one (empty) slice
    try:
        with _writer(path, table.schema) as write:
            for start in progress(starts, f"writing {table.num_rows:,} rows to {path.name}"):
                write(table.slice(start, step))
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        path.unlink(missing_ok=True)
        raise ValueError(f"cannot write these columns to {path.suffix}: {exc} "
                         "(nested columns and unions need .arrow)") from exc


@contextlib.contextmanager
def _writer(path: Path, schema: Any) -> Iterator[Callable[[Any], None]]:
    """A function writing one slice of a table after another to ``path``."""
    import pyarrow as pa

    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(path, schema) as parquet:
            yield parquet.write_table
    elif path.suffix == ".csv":
        import pyarrow.csv

        with pyarrow.csv.CSVWriter(path, schema) as csv:
            yield csv.write_table
    elif path.suffix in (".arrow", ".feather", ".ipc"):
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as ipc:
            yield ipc.write_table
    elif path.suffix in (".jsonl", ".ndjson"):
        with open(path, "w", encoding="utf-8") as out:
            yield lambda piece: _write_json_lines(out, piece)
    else:
        raise ValueError(f"{path}: unknown output format; use .parquet, .arrow, .csv or .jsonl")


def _write_json_lines(out: TextIO, table: Any) -> None:
    """One JSON object per row; bytes as latin-1 text (Avro's JSON encoding), dates and
    decimals as their text."""
    def plain(value: Any) -> Any:
        return value.decode("latin-1") if isinstance(value, bytes) else str(value)

    for row in table.to_pylist():
        out.write(json.dumps(row, default=plain, ensure_ascii=False) + "\n")


# -- commands ----------------------------------------------------------------------------------

def cmd_decode(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from arrowstash.avro import parse_schema
    from arrowstash.avro.decoder import decode
    from arrowstash.avro.framing import strip_header

    schema = parse_schema(args.schema.read_text())
    reader = parse_schema(args.reader_schema.read_text()) if args.reader_schema else None
    framing = "confluent" if args.confluent else args.framing
    with working(f"reading {args.input.name}"):
        messages = read_messages(args.input, args.column)
    expect = schema if framing == "single-object" else None
    batches = []
    steps = range(0, len(messages), CHUNK)
    for start in progress(steps, f"decoding {len(messages):,} messages, steps of {CHUNK:,}"):
        chunk = messages.slice(start, CHUNK)
        if framing:
            chunk = strip_header(chunk, framing, expect=expect).payloads
        batches.append(decode(chunk, schema, threads=args.threads, reader_schema=reader))
    target = (reader or schema).arrow_schema
    table = pa.Table.from_batches(batches, schema=target) if batches else target.empty_table()
    write_table(args.output, table)
    print(f"decoded {table.num_rows:,} messages into {args.output}")
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    from arrowstash.avro import from_arrow_schema, parse_schema
    from arrowstash.avro.encoder import encode
    from arrowstash.avro.framing import add_header
    from arrowstash.avro.ocf import header_of, write_ocf

    with working(f"reading {args.input.name}"):
        table = read_table(args.input)
    schema = parse_schema(args.schema.read_text()) if args.schema else from_arrow_schema(table)
    schema_out = args.schema_out
    if schema_out is None and args.schema is None and args.output.suffix != ".avro":
        schema_out = args.output.with_name(args.output.name + ".avsc")
    if schema_out is not None:
        schema_out.write_text(json.dumps(json.loads(schema.json), indent=2) + "\n")
        print(f"wrote the writer schema to {schema_out}")
    if args.output.suffix == ".avro":
        if args.framing:
            raise ValueError("--framing is for message files, not .avro container files")
        with working(f"encoding {table.num_rows:,} rows into {args.output.name}"):
            write_ocf(table, args.output, schema, args.codec)
        codec = header_of(args.output).codec  # the name in the file: zstd is "zstandard"
        print(f"wrote {table.num_rows:,} records to {args.output} ({codec})")
        return 0
    import pyarrow as pa

    steps = range(0, table.num_rows, CHUNK)
    parts = [encode(table.slice(start, CHUNK), schema)
             for start in progress(steps, f"encoding {table.num_rows:,} rows")]
    messages = pa.concat_arrays(parts) if parts else encode(table, schema)
    if args.framing == "single-object":
        messages = add_header(messages, "single-object",
                              int.from_bytes(schema.fingerprint, "little"))
    elif args.framing:
        if args.schema_id is None:
            raise ValueError(f"--framing {args.framing} needs --schema-id")
        messages = add_header(messages, args.framing, args.schema_id)
    write_messages(args.output, messages)
    print(f"wrote {len(messages):,} messages to {args.output}")
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    from arrowstash.avro.ocf import header_of, read_ocf

    header = header_of(args.file)
    with working(f"reading {args.file.name} ({header.codec})"):
        table = read_ocf(args.file)
    print(f"file     {args.file}")
    print(f"codec    {header.codec}")
    print(f"records  {table.num_rows:,}")
    print(f"schema   {json.dumps(json.loads(header.schema_json))}")
    extra = {k: v for k, v in header.metadata.items() if not k.startswith("avro.")}
    for key, value in extra.items():
        print(f"meta     {key} = {value.decode('utf-8', 'replace')}")
    print()
    shown = table.slice(0, max(args.rows, 0)).to_pylist()
    _table(table.column_names, [[_cell(row[n]) for n in table.column_names] for row in shown])
    if table.num_rows > args.rows:
        print(f"... {table.num_rows - args.rows:,} more")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from arrowstash.avro.ocf import header_of, read_ocf

    header = header_of(args.input)
    with working(f"reading {args.input.name} ({header.codec})"):
        table = read_ocf(args.input)
    write_table(args.output, table)
    print(f"converted {table.num_rows:,} records ({header.codec}) into {args.output}")
    return 0


def _cell(value: Any, width: int = 24) -> str:
    """A value as text, cut to ``width`` characters."""
    text = "null" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(names: list[str], rows: list[list[str]]) -> None:
    from arrowstash.cli._output import table

    table(names, rows)
