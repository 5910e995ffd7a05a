"""Decode Avro datums with the schema they were written with (no resolution) into one Arrow
record batch: the layer under ``decoder.decode``, ``resolve`` and ``ocf``.

``decode_messages`` takes one datum per message (Kafka and the like), ``decode_blocks`` several
datums back to back per block (an Object Container File's blocks after decompression). Both run
the native decoder (``_native._cdecode``: no Python object per value, GIL released except while a
list of ``bytes`` is read in place, messages split across threads) when it is built, else the
pure-Python one (``_python.decoder``); both give the same batches and the same errors.
``ARROWSTASH_AVRO_NATIVE=0`` forces the pure-Python decoder; ``warn_pure_python`` says so once
for the decoder and the encoder alike.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import logging
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

import arrowstash.avro.decode_plan as decode_plan
from arrowstash import config
from arrowstash.avro._python.decoder import DecodeFailure, decode_segments
from arrowstash.avro.schema import Schema, SchemaLike, parse_schema
from arrowstash.avro.threads import thread_count
from arrowstash.errors import AvroDecodeError

__all__ = [
    "decode_blocks",
    "decode_deflated",
    "decode_messages",
    "decode_stream",
    "implementation",
    "native_available",
    "native_inflate_available",
    "scan_blocks",
    "warn_pure_python",
]

logger = logging.getLogger("arrowstash.avro")

_cdecode: Any
try:  # the compiled decoder; absent where the package was installed without a compiler
    _cdecode = importlib.import_module("arrowstash.avro._native._cdecode")
except ImportError:  # pragma: no cover - depends on the build
    _cdecode = None


# The native decoder gives a thread at least this much input: below it, starting a thread and
# merging its part into the first thread's buffers costs more than the thread saves (10,000
# userdata records, 1.2 MB, decoded slower with 2 threads than with 1).
_MIN_BYTES_PER_THREAD = 1 << 20

# The ids of a batch decoded without Confluent headers: Arrow arrays are immutable, so one serves
# every call (pa.array([], ...) took ~18 us, serial time in every decode).
_NO_IDS = pa.array([], pa.int32())


def native_available() -> bool:
    """Whether the C decoder is built and not disabled by ``ARROWSTASH_AVRO_NATIVE=0``; where
    it is, it takes the current limit of items that take no bytes."""
    if _cdecode is None or not config.avro_native():
        warn_pure_python()
        return False
    _cdecode.set_free_items(config.avro_max_empty_items())
    return True


@functools.cache
def warn_pure_python() -> None:
    """Log once per process that the Avro codec runs its pure-Python twin, and why: the same
    results, but a slowdown nobody should have to discover by timing."""
    logger.warning("Avro codec: %s: the same results, about two orders of magnitude slower "
                   "than the native one", implementation())


def implementation() -> str:
    """The decoder in use, for people: "native", or "pure Python" with the reason (about two
    orders of magnitude slower, same results)."""
    if _cdecode is not None and config.avro_native():
        return "native"
    if _cdecode is None:
        return "pure Python (the native core was not built: no C compiler at install)"
    return "pure Python (ARROWSTASH_AVRO_NATIVE=0)"


def native_inflate_available() -> bool:
    """Whether the C decoder can inflate deflate blocks itself: it is built and the system has
    libdeflate, and ``ARROWSTASH_AVRO_LIBDEFLATE=0`` does not turn that off."""
    return native_available() and config.avro_libdeflate() and bool(_cdecode.native_inflate())


@functools.lru_cache(maxsize=64)
def _compiled(schema: Schema) -> decode_plan.Plan:
    return decode_plan.compile_plan(schema)


@functools.lru_cache(maxsize=64)
def _native_plan(schema: Schema) -> Any:
    """The plan as the C decoder holds it, parsed once per schema (parsing it in every call
    took 146 us on a 300-field record: a tenth of decoding 500 such messages)."""
    plan = _compiled(schema)
    return _cdecode.Plan(plan.native, tuple(n.symbols for n in plan.nodes))


def _imported(plan: decode_plan.Plan, exported: Any) -> pa.RecordBatch:
    """The batch the C decoder handed over: through the Arrow C Data Interface, a capsule that
    owns the root ArrowArray until the import moves it out, and its address; or, for a plan
    nested deeper than Arrow's import goes (64 levels), per-node buffers, as the pure-Python
    decoder gives them."""
    if isinstance(exported, list):
        return decode_plan.assemble(plan, exported)
    _capsule, address = exported  # the capsule stays alive until the import has run
    return pa.RecordBatch._import_from_c(address, plan.schema.arrow_schema)


def decode_blocks(
    blocks: Sequence[tuple[Any, int]],
    schema: SchemaLike,
    *,
    threads: int | None = None,
    validate_utf8: bool = True,
) -> pa.RecordBatch:
    """Decode blocks of ``count`` datums written back to back (``(buffer, count)`` pairs) into
    one record batch, rows in block order. Each block must be consumed exactly."""
    plan = _compiled(parse_schema(schema))
    segments = [(b, int(n)) for b, n in blocks]
    if any(n < 0 for _, n in segments):
        raise ValueError("block counts must not be negative")
    nthreads = thread_count(threads)
    if native_available():
        buffers = [b for b, _ in segments]
        counts = [n for _, n in segments]
        result = _cdecode.decode_list(_native_plan(plan.schema), buffers, counts, nthreads,
                                      validate_utf8, False, _MIN_BYTES_PER_THREAD)
        return _imported(plan, _native_result(plan, result, blocks=True)[0])
    columns, _ = _python(plan, segments, validate_utf8, False, blocks=True)
    return decode_plan.assemble(plan, columns)


def decode_stream(
    batches: Iterable[tuple[Sequence[Any], Sequence[int], int]],
    schema: SchemaLike,
    *,
    validate_utf8: bool = True,
) -> pa.RecordBatch | None:
    """Decode blocks as an iterator hands them over, a few at a time (``(buffers, counts,
    bytes_left)``, where ``bytes_left`` guesses the decoded bytes of these blocks and the ones
    after them, 0 if unknown), into one batch on the calling thread; None as soon as a block is
    bad, and the caller then runs ``decode_blocks`` in order for the error. The native decoder
    takes the blocks while the producer (an inflater) has just written them, so they are read
    from the cache and freed at once; the pure-Python one collects the blocks and calls
    ``decode_blocks``."""
    plan = _compiled(parse_schema(schema))
    if not native_available():
        blocks = [(b, n) for buffers, counts, _ in batches for b, n in zip(buffers, counts,
                                                                            strict=True)]
        try:
            return decode_blocks(blocks, plan.schema, threads=1, validate_utf8=validate_utf8)
        except AvroDecodeError:
            return None
    stream = _cdecode.BlockStream(_native_plan(plan.schema), validate_utf8)
    for buffers, counts, left in batches:
        if not stream.feed(buffers, counts, left):
            return None
    exported = stream.finish()
    return None if exported is None else _imported(plan, exported)


def decode_deflated(
    blocks: Sequence[Any], counts: Sequence[int], schema: SchemaLike, *,
    validate_utf8: bool = True, max_bytes: int | None = None,
) -> pa.RecordBatch | None:
    """Raw-deflate blocks of ``counts`` datums, inflated and decoded one by one by the native
    decoder in a single GIL-free call, into one batch; None if a block is bad or they inflate
    past ``max_bytes`` in all (the caller then runs ``decode_blocks`` in order for the error).
    Needs ``native_inflate_available()``."""
    plan = _compiled(parse_schema(schema))
    stream = _cdecode.BlockStream(_native_plan(plan.schema), validate_utf8, True)
    if not stream.feed(blocks, counts, 0, -1 if max_bytes is None else max_bytes):
        return None
    exported = stream.finish()
    return None if exported is None else _imported(plan, exported)


def scan_blocks(data: Any, pos: int, sync: bytes) -> tuple[memoryview, int] | None:
    """A container file's well-formed blocks from ``pos`` on, scanned natively: int64
    quadruples (block start, datum count, payload start, payload size) and the position where
    the scan stopped (the end, or a block it did not accept); None without the extension."""
    if not native_available():
        return None
    table, stop = _cdecode.scan_blocks(data, pos, sync)
    return memoryview(table).cast("q"), stop


def decode_messages(
    messages: Any,
    schema: Schema,
    *,
    threads: int | None = None,
    confluent: bool = False,
    validate_utf8: bool = True,
    native: bool | None = None,
) -> tuple[pa.RecordBatch, pa.Array]:
    """One datum per message decoded with ``schema`` (the writer's): the batch and the
    Confluent ids (int32, empty without ``confluent``). ``messages`` and the errors are as
    ``decoder.decode`` describes. ``native=False`` forces the pure-Python decoder (tests
    compare)."""
    plan = _compiled(schema)
    nthreads = thread_count(threads)
    if native if native is not None else native_available():
        if _cdecode is None:
            raise RuntimeError("the native Avro decoder is not built")
        result = _native_call(plan, messages, nthreads, validate_utf8, confluent)
        exported, id_buffer = _native_result(plan, result, blocks=False)
        batch = _imported(plan, exported)
        ids = (
            pa.Array.from_buffers(pa.int32(), batch.num_rows, [None, pa.py_buffer(id_buffer)])
            if confluent else _NO_IDS
        )
        return batch, ids
    columns, id_list = _python(plan, _segments(messages), validate_utf8, confluent, blocks=False)
    return decode_plan.assemble(plan, columns), pa.array(id_list, pa.int32())


def _segments(messages: Any) -> list[tuple[Any, int]]:
    """One ``(bytes-like or None, 1)`` per message, views into the caller's memory."""
    if isinstance(messages, pa.ChunkedArray):
        return [s for chunk in messages.chunks for s in _segments(chunk)]
    if isinstance(messages, pa.Array):
        if not (pa.types.is_binary(messages.type) or pa.types.is_large_binary(messages.type)):
            raise TypeError(f"messages must be a binary array, not {messages.type}")
        return _array_segments(messages)
    if isinstance(messages, tuple) and len(messages) == 2 and not _bytes_like(messages[1]):
        buffer, offsets = messages
        view = memoryview(buffer).cast("B")
        offs = offsets.to_pylist() if isinstance(offsets, pa.Array) else list(offsets)
        pairs = list(itertools.pairwise(offs))
        if any(b < a for a, b in pairs) or (offs and (offs[0] < 0 or offs[-1] > len(view))):
            raise ValueError("offsets must rise monotonically within the buffer")
        return [(view[a:b], 1) for a, b in pairs]
    if isinstance(messages, (bytes, bytearray, memoryview, str)):
        raise TypeError("messages must be a sequence of messages, not one bytes object")
    return [(m, 1) for m in messages]


def _bytes_like(x: Any) -> bool:
    return isinstance(x, (bytes, bytearray, memoryview, pa.Buffer))


def _array_segments(array: pa.Array) -> list[tuple[Any, int]]:
    validity, offsets_buf, data = array.buffers()
    n, first = len(array), array.offset
    raw = memoryview(offsets_buf).cast("B")
    offsets = raw.cast("q") if pa.types.is_large_binary(array.type) else raw.cast("i")
    offsets = offsets[first : first + n + 1]
    view = memoryview(data if data is not None else b"").cast("B")
    valid = array.is_valid().to_pylist() if validity is not None and array.null_count else None
    return [
        (view[offsets[i] : offsets[i + 1]] if valid is None or valid[i] else None, 1)
        for i in range(n)
    ]


def _native_call(
    plan: decode_plan.Plan, messages: Any, nthreads: int, validate_utf8: bool, confluent: bool
) -> Any:
    """Hand the messages to the C decoder in place: an array's buffers, a buffer and its
    offsets, or the list itself (the C side takes each item's memory through the buffer
    protocol)."""
    args = (nthreads, validate_utf8, confluent, _MIN_BYTES_PER_THREAD)
    if isinstance(messages, pa.ChunkedArray):
        # one array (a table's column is chunked): a lone chunk is read in place, several are
        # concatenated first, a copy of the input that costs a fraction of the decode; a
        # memoryview per message through the general path was 32x slower (100 ms against 3.1
        # for 100,000 flat messages)
        one = messages.num_chunks == 1
        messages = messages.chunk(0) if one else messages.combine_chunks()
    if isinstance(messages, pa.Array):
        if not (pa.types.is_binary(messages.type) or pa.types.is_large_binary(messages.type)):
            raise TypeError(f"messages must be a binary array, not {messages.type}")
        validity, offsets, data = messages.buffers()
        width = 8 if pa.types.is_large_binary(messages.type) else 4
        return _cdecode.decode_concat(
            _native_plan(plan.schema), data if data is not None else b"", offsets, width,
            messages.offset, len(messages), validity if messages.null_count else None, *args,
        )
    if isinstance(messages, tuple) and len(messages) == 2 and not _bytes_like(messages[1]):
        buffer, offsets = messages
        if isinstance(offsets, pa.Array):
            as_int64 = offsets.cast(pa.int64())
            view = memoryview(as_int64.buffers()[1]).cast("B").cast("q")
            offsets = view[as_int64.offset : as_int64.offset + len(as_int64)]
        offs = array("q", offsets)
        return _cdecode.decode_concat(
            _native_plan(plan.schema), buffer, offs, 8, 0, max(len(offs) - 1, 0), None, *args
        )
    if isinstance(messages, (bytes, bytearray, memoryview, str)):
        raise TypeError("messages must be a sequence of messages, not one bytes object")
    return _cdecode.decode_list(_native_plan(plan.schema), messages, None, *args)


def _native_result(plan: decode_plan.Plan, result: Any, *, blocks: bool) -> tuple[Any, Any]:
    if result[0] == 0:
        return result[1], result[2]
    _, code, segment, datum, offset, node, detail = result
    message = decode_plan.error_message(plan, code, segment, datum, offset, node, detail, blocks)
    raise AvroDecodeError(message)


def _python(
    plan: decode_plan.Plan,
    segments: list[tuple[Any, int]],
    validate_utf8: bool,
    confluent: bool,
    *,
    blocks: bool,
) -> tuple[list[tuple[int, int, list[Any]]], list[int]]:
    try:
        return decode_segments(plan, segments, validate_utf8=validate_utf8, confluent=confluent)
    except DecodeFailure as exc:
        message = decode_plan.error_message(
            plan, exc.code, exc.segment, exc.datum, exc.offset, exc.node, exc.detail, blocks
        )
        raise AvroDecodeError(message) from None
