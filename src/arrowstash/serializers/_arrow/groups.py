"""Compressed frames as groups of columns, packed and compressed in worker threads.

A compressed table is written as consecutive groups of columns of about ``batch_bytes / 4``,
one IPC stream (section) per group, so a hit gets one chunk per column and nothing to join.
Packing (see _packing) and compressing a group is independent of the others, so worker threads
(one per core, up to four) work on the next groups while the writer writes the current one. A
column larger than ``batch_bytes`` is a group of its own, written as slices of about
``batch_bytes``, each packed and compressed by a worker as well; a hit widens a number column's
slices into one buffer (see _packing.unpack). Jobs are handed out at most ``AHEAD`` at a time
and a group's columns are packed one at a time (see _ipc_writer), which bounds the memory a
store needs beyond the frame; all of it comes from _packing.POOL.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from arrowstash.serializers._arrow.batches import rebatch, rows_per_batch
from arrowstash.serializers._arrow.ipc_writer import EOS, BatchWriter, supported
from arrowstash.serializers._arrow.packing import POOL, Packer, pack_whole, packer, unpack

Section = Callable[[Any], None]

#: Jobs handed to the workers ahead of the one being written, and the bytes of the columns
#: they cover. Enough that a worker never waits for the writer to wake up (on a loaded machine
#: each such wait costs a time slice: 2 ahead made flights' store 1.5x slower than 16). Only
#: running jobs hold packed columns; finished ones hold compressed bytes until the writer gets
#: to them, which on a busy disk can be many: the bytes bound what they hold (up to about
#: AHEAD_BYTES, for incompressible columns).
AHEAD = 16
AHEAD_BYTES = 64 << 20

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
    """Consecutive column positions in groups of at most a quarter of ``batch_bytes`` (a larger
    column is a group of its own). Each group is one worker's job: small jobs keep both cores
    busy to the end and bound the memory a job holds (with whole batches as groups, a flights
    store took half again as long and peaked ten times higher, at the same stored size)."""
    batch_bytes //= 4
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
    queues: list[deque[Any]] = [deque() for _ in parts]
    ended = [False] * len(parts)
    jobs = _jobs(parts, batch_bytes, codec)
    pending = [0, 0]  # jobs handed out and not yet written, and their columns' bytes

    def top_up(at_least: int = 0) -> None:
        while (pending[0] < AHEAD and pending[1] < AHEAD_BYTES) or at_least > 0:
            item = next(jobs, None)
            if item is None:
                return
            k, kind, job = item
            if kind == "end":
                ended[k] = True
            elif kind == "work":
                work, nbytes = job
                queues[k].append((_workers().submit(work), nbytes))
                pending[0] += 1
                pending[1] += nbytes
            else:  # "pieces", or "write": a Section run in the writer's thread
                queues[k].append(job)
            at_least -= 1

    def section(k: int) -> Section:
        def write(sink: Any) -> None:
            while queues[k] or not ended[k]:
                if not queues[k]:
                    top_up(at_least=1)
                    continue
                job = queues[k].popleft()
                if isinstance(job, tuple):
                    pending[0] -= 1
                    pending[1] -= job[1]
                    job = job[0].result()
                    top_up()
                if callable(job):  # a section of a type written through pyarrow's writer
                    job(sink)
                    continue
                for piece in job:
                    sink.write(piece)

        return write

    def schema(sink: Any) -> None:
        top_up()
        write_stream(table.schema, [], sink, pa.ipc.IpcWriteOptions(compression=codec))

    return [schema, *(section(k) for k in range(len(parts)))]


def _jobs(parts: list[pa.Table], batch_bytes: int, codec: pa.Codec
          ) -> Iterator[tuple[int, str, Any]]:
    """(section, kind, job) in the order they are written: "work" for a worker (a function
    giving pieces, and the bytes of the columns it packs), "pieces" ready to write, "write" a
    Section to run in the writer's thread, "end" after a section's last. A column larger than
    a batch is decided (packed or not) here, then sliced into jobs."""
    for k, part in enumerate(parts):
        if part.num_columns > 1 or part.nbytes <= batch_bytes * 1.5:
            yield k, "work", (functools.partial(_pack_group, part, codec), part.nbytes)
        else:
            column, field = part.column(0), part.schema.field(0)
            found = packer(column, codec)
            stored = field if found is None else field.with_type(found[0])
            if supported(stored.type):
                yield k, "pieces", [pa.schema([stored]).serialize()]
                for values in _slices(column, batch_bytes):
                    yield k, "work", (functools.partial(_pack_slice, values, found, codec),
                                      values.nbytes)
                yield k, "pieces", [EOS]
            else:
                yield k, "write", functools.partial(_write_sliced, part, batch_bytes, codec,
                                                    found)
        yield k, "end", None


def _slices(column: pa.ChunkedArray, batch_bytes: int) -> Iterator[pa.Array]:
    """Slices of about ``batch_bytes``, starting at multiples of 64 rows of their chunk (a
    validity bitmap is then cut, not shifted)."""
    step = rows_per_batch(column.nbytes, len(column), batch_bytes)
    step += -step % 64
    for chunk in column.chunks:
        if len(chunk) <= step * 1.5:
            yield chunk
        else:
            yield from (chunk.slice(start, step) for start in range(0, len(chunk), step))


def _pack_group(part: pa.Table, codec: pa.Codec) -> list[Any]:
    """The stream of one packed, compressed batch of ``part``'s columns, as pieces."""
    fields = list(part.schema)
    if not all(supported(f.type) for f in fields):
        return _pack_and_compress(part, codec)

    def columns() -> Iterator[pa.Array]:
        # one at a time: a column is packed, compressed and dropped before the next is packed
        for position, column in enumerate(part.columns):
            packed = pack_whole(column, codec)
            if isinstance(packed, pa.ChunkedArray):  # strings from read_csv come in chunks
                packed = packed.chunk(0) if packed.num_chunks == 1 else \
                    pa.concat_arrays(packed.chunks, memory_pool=POOL)
            fields[position] = fields[position].with_type(packed.type)
            yield packed
            del packed

    messages = BatchWriter(codec, POOL).batch(columns(), part.num_rows)
    POOL.release_unused()
    return [pa.schema(fields).serialize(), *messages, EOS]


def _pack_slice(values: pa.Array, found: tuple[pa.DataType, Packer] | None, codec: pa.Codec
                ) -> list[Any]:
    packed = values if found is None else found[1](values)
    messages = BatchWriter(codec, POOL).batch([packed], len(packed))
    del packed
    POOL.release_unused()
    return messages


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


def _pack_and_compress(part: pa.Table, codec: pa.Codec) -> list[Any]:
    """Through pyarrow's writer, for the types _ipc_writer does not write (nested ones)."""
    # one batch: a column's chunks are joined (strings from read_csv come in several)
    packed = pa.table([pack_whole(c, codec) for c in part.columns], names=part.column_names)
    sink = _Pieces()
    options = pa.ipc.IpcWriteOptions(compression=codec, use_threads=False)
    write_stream(packed.schema, packed.combine_chunks().to_batches(), sink, options)
    del packed
    # hand this thread's freed pages back (mimalloc keeps them per thread otherwise, and a
    # store's peak memory would grow with every group)
    pa.default_memory_pool().release_unused()
    return sink.pieces


def _write_sliced(part: pa.Table, batch_bytes: int, codec: pa.Codec,
                  found: tuple[pa.DataType, Packer] | None, sink: Any) -> None:
    options = pa.ipc.IpcWriteOptions(compression=codec, use_threads=True)
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
