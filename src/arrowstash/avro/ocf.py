"""Avro Object Container Files: the header, the blocks, their codecs, and tables in and out.

A file is ``Obj\\x01``, a metadata map (``avro.schema``, ``avro.codec``, ...), a 16-byte sync
marker, then blocks: a datum count, a byte size, the (compressed) datums and the sync marker
again. An uncompressed file's blocks are decoded in place by
:func:`arrowstash.avro.decode_blocks`, which splits them across threads. A compressed file's
blocks are cut into one run per thread, and each thread decompresses and decodes its own run
a few blocks at a time (every codec here and the native decoder release the GIL), so inflated
blocks are decoded from the cache and freed, and no thread waits for another. Every structural
problem is an :class:`~arrowstash.AvroDecodeError` naming the block and the byte offset in the
file.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, TypeAlias

import pyarrow as pa

from arrowstash.avro.encoder import encode
from arrowstash.avro.framing import offsets_and_data
from arrowstash.avro.from_arrow import from_arrow_schema
from arrowstash.avro.numpy_import import numpy as np
from arrowstash.avro.ocf_codecs import (
    CODECS,
    COMPRESS,
    DECOMPRESS,
    DECOMPRESS_ERRORS,
    INFLATE_MAX_RATIO,
    Budget,
    TooLarge,
    bounded,
    codec_name,
    decompress_block,
    inflater,
)
from arrowstash.avro.ocf_codecs import Corrupt as _Corrupt
from arrowstash.avro.resolve import pruned, resolve
from arrowstash.avro.schema import Record, Schema, parse_schema
from arrowstash.avro.threads import thread_count
from arrowstash.avro.writer_decoder import (
    decode_blocks,
    decode_deflated,
    decode_stream,
    native_inflate_available,
    scan_blocks,
)
from arrowstash.errors import AvroDecodeError, AvroSchemaError

__all__ = ["CODECS", "MAX_BYTES", "MAX_ROWS", "Header", "codec_name", "header_of", "read_header",
           "read_ocf", "write_ocf"]

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
#: ``read_ocf``'s default limits: the rows a file's blocks may declare in all, and the bytes its
#: compressed blocks may decompress to in all. A few kilobytes of zstandard can declare 2**30
#: rows or inflate to gigabytes; files past these need ``max_rows``/``max_bytes`` said outright.
MAX_ROWS = 1 << 28
MAX_BYTES = 1 << 32

#: Where a file is read from: a path (memory-mapped), a binary file object, or bytes in memory.
Source: TypeAlias = "str | os.PathLike[str] | BinaryIO | IO[bytes] | bytes | memoryview | pa.Buffer"
#: Where a file is written: a path or a binary file object.
Destination: TypeAlias = "str | os.PathLike[str] | BinaryIO | IO[bytes]"


# -- varints ----------------------------------------------------------------------------------

class _Cursor:
    """Reads Avro longs and byte strings from a buffer, bounds-checked."""

    def __init__(self, data: memoryview, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def long(self, what: str) -> int:
        data, pos = self.data, self.pos
        shift = result = 0
        while True:
            if pos >= len(data):
                raise _Truncated(f"file ends inside {what}")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise _Corrupt(f"{what} is a varint longer than 10 bytes")
        self.pos = pos
        return (result >> 1) ^ -(result & 1)

    def take(self, size: int, what: str) -> memoryview:
        if size < 0:
            raise _Corrupt(f"{what} has negative size {size}")
        end = self.pos + size
        if end > len(self.data):
            raise _Truncated(f"file ends inside {what} ({size} bytes announced, "
                             f"{len(self.data) - self.pos} left)")
        view = self.data[self.pos : end]
        self.pos = end
        return view


class _Truncated(Exception):
    pass




def _long(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# -- header -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Header:
    """What a file's header says: its metadata, codec, schema JSON and sync marker."""

    metadata: dict[str, bytes]
    sync: bytes
    size: int  # bytes up to the first block

    @property
    def codec(self) -> str:
        return self.metadata.get("avro.codec", b"null").decode("utf-8", "replace") or "null"

    @property
    def schema_json(self) -> str:
        try:
            return self.metadata["avro.schema"].decode()
        except KeyError:
            raise AvroDecodeError("the file's header has no avro.schema") from None
        except UnicodeDecodeError as exc:
            raise AvroDecodeError(f"the file's avro.schema is not UTF-8: {exc}") from None


def read_header(data: memoryview) -> Header:
    """Parse the header at the start of ``data``."""
    if bytes(data[:4]) == b"Obj\x00":
        raise AvroDecodeError("a version 0 container file (Avro 1.2); only version 1 is read")
    if bytes(data[:4]) != MAGIC:
        raise AvroDecodeError(
            f"not an Avro object container file: starts {bytes(data[:4])!r}, not {MAGIC!r}"
        )
    cursor = _Cursor(data, 4)
    metadata: dict[str, bytes] = {}
    try:
        while True:
            count = cursor.long("the header's metadata map")
            if count == 0:
                break
            if count < 0:  # a negative count is followed by the block's size in bytes
                count = -count
                cursor.long("the header's metadata map")
            for _ in range(count):
                key = bytes(cursor.take(cursor.long("a metadata key"), "a metadata key"))
                value = bytes(cursor.take(cursor.long("a metadata value"), "a metadata value"))
                metadata[key.decode("utf-8", "replace")] = value
        sync = bytes(cursor.take(SYNC_SIZE, "the header's sync marker"))
    except (_Truncated, _Corrupt) as exc:
        raise AvroDecodeError(f"header at byte {cursor.pos}: {exc}") from None
    return Header(metadata, sync, cursor.pos)


class _Block:
    """One block: its index, where its count starts in the file, its datum count and its
    (compressed) datums. Slots, not a dataclass: a file has thousands of blocks."""

    __slots__ = ("count", "data", "index", "offset")

    def __init__(self, index: int, offset: int, count: int, data: memoryview) -> None:
        self.index, self.offset, self.count, self.data = index, offset, count, data


def _blocks(data: memoryview, header: Header) -> tuple[list[_Block], AvroDecodeError | None]:
    """The well-formed blocks, and the error that stopped the scan early (if any): the caller
    decodes the blocks before it, so problems are reported in file order. The native scanner
    (when built) walks the good blocks; this one goes on from wherever it stopped, so any
    problem is found and worded here."""
    blocks: list[_Block] = []
    cursor = _Cursor(data, header.size)
    scanned = scan_blocks(data, header.size, header.sync)
    if scanned is not None:
        table, cursor.pos = scanned
        starts, counts, payloads, sizes = (table[k::4].tolist() for k in range(4))
        blocks = [_Block(i, start, count, data[at : at + size]) for i, (start, count, at, size)
                  in enumerate(zip(starts, counts, payloads, sizes, strict=True))]
    while cursor.pos < len(data):
        index, start = len(blocks), cursor.pos
        try:
            count = cursor.long("the block's datum count")
            size = cursor.long("the block's byte size")
            if count < 0:
                raise _Corrupt(f"negative datum count {count}")
            payload = cursor.take(size, "the block's data")
            marker = cursor.take(SYNC_SIZE, "the block's sync marker")
        except (_Truncated, _Corrupt) as exc:
            return blocks, AvroDecodeError(f"block {index} at byte {start}: {exc}")
        if bytes(marker) != header.sync:
            return blocks, AvroDecodeError(
                f"block {index} at byte {start}: the sync marker at byte {cursor.pos - SYNC_SIZE}"
                " does not match the header's (corrupt or spliced file)"
            )
        blocks.append(_Block(index, start, count, payload))
    return blocks, None


# -- reading ----------------------------------------------------------------------------------

def _open(source: Source) -> pa.Buffer:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.stat().st_size == 0:
            return pa.py_buffer(b"")
        with pa.memory_map(str(path)) as mapped:
            return mapped.read_buffer()
    if isinstance(source, (bytes, bytearray, memoryview, pa.Buffer)):
        return pa.py_buffer(source)
    return pa.py_buffer(source.read())


def read_ocf(source: Source, *, threads: int | None = None,
             columns: Sequence[str] | None = None, reader_schema: Any = None,
             max_rows: int | None = MAX_ROWS, max_bytes: int | None = MAX_BYTES) -> pa.Table:
    """Read an Object Container File into a table.

    ``source`` is a path (memory-mapped), a binary file object or bytes. ``columns`` keeps only
    those top-level fields (the others are read past, not decoded); ``reader_schema`` resolves
    the writer's schema to it (added fields with defaults, promotions, aliases, ...). Blocks are
    decompressed and decoded on ``threads`` threads (default: the usable cores). A file whose
    blocks declare more than ``max_rows`` rows, or whose compressed blocks decompress to more
    than ``max_bytes`` bytes in all, is refused with AvroDecodeError before it is decoded
    (None: no limit), so a small hostile file cannot take minutes or gigabytes.
    """
    _check_limit("max_rows", max_rows)
    _check_limit("max_bytes", max_bytes)
    data = memoryview(_open(source))
    header = read_header(data)
    codec = header.codec
    if codec not in DECOMPRESS:
        raise AvroDecodeError(f"the file uses codec {codec!r}, which is not one of {CODECS}")
    try:
        writer = _header_schema(header.schema_json)
    except AvroSchemaError as exc:  # a damaged header, as far as this file is concerned
        raise AvroDecodeError(f"the file's header holds an invalid schema: {exc}") from exc
    reader = None if reader_schema is None else parse_schema(reader_schema)
    if reader is None and columns is not None and isinstance(writer.root, Record):
        reader = _projection(writer, columns)
    if reader is not None:  # the fields the reader drops are read past, never decoded
        writer = pruned(writer, reader)
    blocks, broken = _blocks(data, header)
    rows = sum(block.count for block in blocks)
    if max_rows is not None and rows > max_rows:
        raise AvroDecodeError(f"the file's blocks declare {rows} rows, more than "
                              f"max_rows={max_rows}; pass a larger max_rows (or None) to read it")
    workers = thread_count(threads)
    budget = Budget(max_bytes)
    batches = None
    if broken is None and codec != "null" and blocks:
        batches = _read_runs(codec, blocks, writer, workers, budget)
    if batches is None:  # uncompressed, or a bad block: in file order, one batch
        batches = [_read_blocks(codec, blocks, writer, workers, budget)]
        if broken is not None:
            raise broken
    if reader is not None:
        batches = [resolve(batch, writer, reader) for batch in batches]
    table = pa.Table.from_batches(batches)
    if columns is not None:
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise KeyError(f"no column(s) {missing} in the file; it has {table.column_names}")
        table = table.select(list(columns))
    return table


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 0):
        raise ValueError(f"{name} must be a non-negative int or None, not {value!r}")


@functools.lru_cache(maxsize=32)
def _header_schema(text: str) -> Schema:
    """The parsed schema of a header's JSON: files of one schema are read again and again, and
    parsing took ~0.3 ms, about 1.5% of reading 100,000 records of a deflate file."""
    return parse_schema(text)


def _projection(writer: Schema, columns: Sequence[str]) -> Schema:
    """The writer's schema cut to the top-level fields ``columns``, to read the file with: the
    other fields are read past, never decoded."""
    root = writer.root
    assert isinstance(root, Record)
    names = [f.name for f in root.fields]
    missing = [c for c in columns if c not in names]
    if missing:
        raise KeyError(f"no column(s) {missing} in the file; it has {names}")
    kept = tuple(f for f in root.fields if f.name in set(columns))
    return Schema(dataclasses.replace(root, fields=kept), {})


def _read_blocks(codec: str, blocks: list[_Block], writer: Any, threads: int,
                 budget: Budget) -> pa.RecordBatch:
    """Decompress then decode ``blocks`` as one batch; the first bad block raises."""
    raw = [decompress_block(codec, block, budget) for block in blocks]
    try:
        return decode_blocks(
            [(payload, block.count) for payload, block in zip(raw, blocks, strict=True)],
            writer, threads=threads,
        )
    except AvroDecodeError as exc:  # say where in the file the failing block is
        found = re.match(r"block (\d+)", str(exc))
        if found is None or int(found[1]) >= len(blocks):
            raise
        block = blocks[int(found[1])]
        raise AvroDecodeError(f"{exc} (block {block.index} starts at byte {block.offset} of the "
                              "file)") from None


def _runs(blocks: list[_Block], n: int) -> list[list[_Block]]:
    """``blocks`` cut into at most ``n`` contiguous runs of about equal compressed bytes."""
    total = sum(len(block.data) for block in blocks)
    runs: list[list[_Block]] = [[]]
    done = 0
    for block in blocks:
        if runs[-1] and done >= total * len(runs) / n:
            runs.append([])
        runs[-1].append(block)
        done += len(block.data)
    return runs


#: Blocks inflated before they are decoded together: each call into the inflater and the
#: decoder takes the GIL back (which the other threads want too), and 8 fastavro-sized blocks
#: (16 kB inflated) still sit in the cache when they are decoded.
_BLOCKS_PER_FEED = 8


def _read_runs(codec: str, blocks: list[_Block], writer: Any, workers: int,
               budget: Budget) -> list[pa.RecordBatch] | None:
    """One batch per run of blocks, each run decompressed and decoded by its own thread (the
    calling thread takes the first run), a few blocks at a time, so that the inflated blocks are
    decoded while they are in the cache and freed at once (deflate blocks one at a time, in one
    native call per run, where libdeflate is there); None if any block fails (the caller then
    reads in file order to report the first bad one). Each run may decompress to its share of
    ``budget``; a run past it also returns None (the file-order read then holds the whole file
    to the whole budget)."""
    decompress, errors = DECOMPRESS[codec], (*DECOMPRESS_ERRORS, TooLarge)
    natively = codec == "deflate" and native_inflate_available()
    total = sum(len(block.data) for block in blocks)
    if codec == "deflate":  # the inflater itself: its errors are caught below, once per run
        inflate, inflate_errors = inflater()
        errors = (*errors, *inflate_errors)

        def decompress(data: memoryview, room: int) -> Any:
            if len(data) * INFLATE_MAX_RATIO + 65536 > room:
                return bounded(zlib.decompressobj(-15), data, room)
            return inflate(data)

    def inflated(blocks: list[_Block], share: Budget
                 ) -> Iterator[tuple[list[Any], list[int], int]]:
        packed = sum(len(block.data) for block in blocks)
        done = raw = 0
        for at in range(0, len(blocks), _BLOCKS_PER_FEED):
            group = blocks[at : at + _BLOCKS_PER_FEED]
            payloads = []
            for block in group:
                payloads.append(decompress(block.data, share.left))
                share.left -= memoryview(payloads[-1]).nbytes
            size = sum(memoryview(payload).nbytes for payload in payloads)
            sent = sum(len(block.data) for block in group)
            # these blocks' and the later ones' decoded bytes, at the ratio seen so far
            left = (packed - done) * (raw + size) // max(done + sent, 1)
            done += sent
            raw += size
            yield payloads, [block.count for block in group], left

    def run(blocks: list[_Block]) -> pa.RecordBatch | None:
        share = budget.share(sum(len(block.data) for block in blocks), total)
        if natively:
            return decode_deflated([block.data for block in blocks],
                                   [block.count for block in blocks], writer,
                                   max_bytes=share.max_bytes)
        try:
            return decode_stream(inflated(blocks, share), writer)
        except errors:
            return None

    runs = _runs(blocks, workers)
    if len(runs) == 1:
        batches = [run(runs[0])]
    else:
        with ThreadPoolExecutor(len(runs) - 1) as pool:
            later = pool.map(run, runs[1:])
            batches = [run(runs[0]), *later]
    done = [batch for batch in batches if batch is not None]
    return done if len(done) == len(batches) else None


# -- writing ----------------------------------------------------------------------------------

def _header_bytes(metadata: dict[str, bytes], sync: bytes) -> bytes:
    out = bytearray(MAGIC)
    out += _long(len(metadata))
    for key, value in metadata.items():
        encoded = key.encode()
        out += _long(len(encoded)) + encoded + _long(len(value)) + value
    out += _long(0) + sync
    return bytes(out)


def _block_bounds(offsets: np.ndarray, block_bytes: int) -> list[tuple[int, int]]:
    """Row ranges whose datums add up to about ``block_bytes`` each (at least one row)."""
    n = offsets.size - 1
    bounds: list[tuple[int, int]] = []
    start = 0
    while start < n:
        stop = int(np.searchsorted(offsets, offsets[start] + block_bytes, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        bounds.append((start, stop))
        start = stop
    return bounds


def write_ocf(table: pa.Table | pa.RecordBatch, destination: Destination, schema: Any = None,
              codec: str | None = "zstd", *, level: int | None = None,
              block_bytes: int = 1 << 20, threads: int | None = None,
              metadata: dict[str, bytes] | None = None) -> None:
    """Write ``table`` as an Object Container File.

    ``schema`` defaults to :func:`from_arrow_schema` of the table's schema (which reuses the
    Avro schema a decoded table carries in its metadata). Blocks hold about ``block_bytes`` of
    encoded datums each and are compressed with ``codec`` in parallel. ``metadata`` adds
    user keys to the header (``avro.*`` keys are reserved).
    """
    name = codec_name(codec)
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be positive, not {block_bytes}")
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    parsed = from_arrow_schema(table) if schema is None else parse_schema(schema)
    workers = thread_count(threads)
    encoded = encode(table, parsed, threads=workers)
    offsets, payload = offsets_and_data(encoded)
    bounds = _block_bounds(offsets, block_bytes)
    view = payload.data
    slices = [view[int(offsets[a]) : int(offsets[b])] for a, b in bounds]
    compress = COMPRESS[name]
    if name == "null" or workers == 1 or len(slices) < 2:
        compressed = [compress(s, level) for s in slices]
    else:
        with ThreadPoolExecutor(min(workers, len(slices))) as pool:
            compressed = list(pool.map(lambda s: compress(s, level), slices))
    extra = dict(metadata or {})
    reserved = [k for k in extra if k.startswith("avro.")]
    if reserved:
        raise ValueError(f"metadata keys {reserved} are reserved by the Avro specification")
    header_metadata = {"avro.schema": parsed.json.encode(),
                       "avro.codec": name.encode(), **extra}
    sync = os.urandom(SYNC_SIZE)
    parts: list[Any] = [_header_bytes(header_metadata, sync)]
    for (a, b), block in zip(bounds, compressed, strict=True):
        parts += [_long(b - a) + _long(memoryview(block).nbytes), block, sync]
    if isinstance(destination, (str, os.PathLike)):
        with open(destination, "wb") as out:
            out.writelines(parts)
    else:
        for part in parts:
            destination.write(part)


def header_of(source: Source) -> Header:
    """The header of a file (for tools that show its schema and codec)."""
    return read_header(memoryview(_open(source)))

