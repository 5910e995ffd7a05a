"""Compressed frames as groups of columns, packed and compressed in worker threads.

A compressed table is written as consecutive groups of columns of about ``batch_bytes`` each,
one IPC stream (section) per group, so a hit gets one chunk per column and nothing to join.
Packing (see _packing) and compressing a group is independent of the others, so worker threads
(one per core, up to four) work on the next groups while the writer writes the current one.
Groups are handed out at most ``AHEAD`` at a time and only running tasks hold packed columns,
which bounds the memory a store needs beyond the frame. A column larger than ``batch_bytes``
is a group of its own, streamed in slices by the writer (Arrow compresses each slice's buffers
in parallel); a hit widens a number column's slices into one buffer (see _packing.unpack).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from arrowstash.serializers._batches import rebatch
from arrowstash.serializers._packing import pack_whole, packer, unpack

Section = Callable[[Any], None]

#: Groups handed to the workers ahead of the one being written. Enough that a worker never
#: waits for the writer to wake up (on a loaded machine each such wait costs a time slice:
#: 2 ahead made flights' store 1.5x slower than 16). Only running tasks hold packed columns;
#: finished ones hold compressed bytes, which the writer drains at disk speed.
AHEAD = 16

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(min(4, os.cpu_count() or 2),
                                       thread_name_prefix="arrowstash-pack")
        return _pool


def size_groups(table: pa.Table, batch_bytes: int) -> list[list[int]]:
    """Consecutive column positions in groups of at most ``batch_bytes`` (a larger column is a
    group of its own)."""
    groups: list[list[int]] = [[]]
    size = 0
    for position, column in enumerate(table.columns):
        if groups[-1] and size + column.nbytes > batch_bytes:
            groups.append([])
            size = 0
        groups[-1].append(position)
        size += column.nbytes
    return groups


def write_stream(schema: pa.Schema, batches: Any, sink: Any,
                 options: pa.ipc.IpcWriteOptions) -> None:
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)


def group_sections(table: pa.Table, groups: list[list[int]], batch_bytes: int,
                   codec: pa.Codec) -> list[Section]:
    """Section writers: a stream holding only ``table``'s schema (writing it starts the
    workers), then one per group of columns."""
    parts = [table.select(g).replace_schema_metadata(None) for g in groups]
    whole = [p.num_columns > 1 or p.nbytes <= batch_bytes * 1.5 for p in parts]
    # in the workers, one thread per group; with one group, Arrow's threads per buffer
    own = pa.ipc.IpcWriteOptions(compression=codec, use_threads=sum(whole) < 2)
    futures: dict[int, Future[list[Any]]] = {}
    submitted = 0  # groups before this one were handed out (a written group's future is gone)

    def start(upto: int) -> None:
        nonlocal submitted
        for k in range(submitted, min(upto, len(parts))):
            if whole[k]:
                futures[k] = _workers().submit(_pack_and_compress, parts[k], codec, own)
        submitted = max(submitted, min(upto, len(parts)))

    def section(k: int) -> Section:
        def write(sink: Any) -> None:
            start(k + 1 + AHEAD)
            if whole[k]:
                for piece in futures.pop(k).result():
                    sink.write(piece)
            else:
                _write_sliced(parts[k], batch_bytes, sink, codec)

        return write

    def schema(sink: Any) -> None:
        start(AHEAD)
        write_stream(table.schema, [], sink, own)

    return [schema, *(section(k) for k in range(len(parts)))]


class _Pieces:
    """A write-only file keeping what it is given: the IPC writer hands over its compressed
    buffers as they are, so nothing is copied or grown before the writer writes them."""

    closed = False

    def __init__(self) -> None:
        self.pieces: list[Any] = []

    def write(self, data: Any) -> int:
        self.pieces.append(data)
        return memoryview(data).nbytes

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass


def _pack_and_compress(part: pa.Table, codec: pa.Codec, options: pa.ipc.IpcWriteOptions
                       ) -> list[Any]:
    # one batch: a column's chunks are joined (strings from read_csv come in several)
    packed = pa.table([pack_whole(c, codec) for c in part.columns], names=part.column_names)
    sink = _Pieces()
    write_stream(packed.schema, packed.combine_chunks().to_batches(), sink, options)
    del packed
    # hand this thread's freed pages back (mimalloc keeps them per thread otherwise, and a
    # store's peak memory would grow with every group)
    pa.default_memory_pool().release_unused()
    return sink.pieces


def _write_sliced(part: pa.Table, batch_bytes: int, sink: Any, codec: pa.Codec) -> None:
    options = pa.ipc.IpcWriteOptions(compression=codec, use_threads=True)
    column = part.column(0)
    found = packer(column, codec)
    slices = rebatch(iter(part.to_batches()), batch_bytes)
    if found is None:
        return write_stream(part.schema, slices, sink, options)
    schema = pa.schema([pa.field(part.column_names[0], found[0])])
    write_stream(schema, (pa.record_batch([found[1](batch.column(0))], schema=schema)
                          for batch in slices), sink, options)
    return None


def read_groups(groups: list[tuple[list[int], memoryview]], schema: pa.Schema, packed: bool
                ) -> Iterator[list[pa.ChunkedArray]]:
    """Each group's columns, back in their ``schema`` types. Packed (compressed) groups are
    decompressed in the worker threads, one group each: Arrow decompresses a batch's buffers in
    parallel, but a one-column group has one or two."""

    def read(item: tuple[list[int], memoryview]) -> list[pa.ChunkedArray]:
        positions, section = item
        part = pa.ipc.open_stream(pa.py_buffer(section)).read_all()
        return [unpack(column, schema.field(position).type)
                for position, column in zip(positions, part.columns, strict=True)]

    if packed and len(groups) > 1:
        return _workers().map(read, groups)
    return map(read, groups)
