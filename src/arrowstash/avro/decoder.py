"""``decode``: one Avro datum per message into one Arrow record batch, resolved to a reader's
schema when one is given.

The decoding itself (native or pure Python, and the blocks of container files) lives in
``writer_decoder``, which reads with the writer's schema only; ``resolve`` then turns that batch
into the reader's. ``decode_blocks``, ``implementation``, ``native_available`` and
``warn_pure_python`` are re-exported so that their long-standing import path keeps working.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from arrowstash.avro.schema import SchemaLike, parse_schema
from arrowstash.avro.writer_decoder import (
    decode_blocks,
    decode_messages,
    implementation,
    native_available,
    warn_pure_python,
)

__all__ = ["decode", "decode_blocks", "implementation", "native_available", "warn_pure_python"]


def decode(
    messages: Any,
    schema: SchemaLike,
    *,
    threads: int | None = None,
    confluent: bool = False,
    schema_id_column: str | None = None,
    reader_schema: SchemaLike | None = None,
    validate_utf8: bool = True,
) -> pa.RecordBatch:
    """Decode one Avro datum per message into one record batch (one row per message).

    ``messages``: a sequence of bytes-like objects, a ``pyarrow`` ``BinaryArray`` or
    ``LargeBinaryArray`` (read in place over its buffers; a null message is an error) or a
    ``ChunkedArray`` of one (several chunks are concatenated first), or a ``(buffer, offsets)``
    pair where message ``i`` is ``buffer[offsets[i]:offsets[i + 1]]``.
    ``confluent=True`` checks and strips the Confluent header (magic byte 0 + 4-byte schema id);
    ``schema_id_column`` then names an extra int32 column holding each message's schema id.
    ``reader_schema`` resolves the decoded batch to that schema (the specification's schema
    resolution). Every message must hold exactly one datum: trailing bytes are an error.
    ``threads=None`` uses the usable cores; the native decoder gives each thread at least 1 MiB
    of messages (a smaller batch decodes on the calling thread alone; the batch is the same).
    Raises AvroDecodeError naming the message index and byte offset of the first bad message.
    """
    if schema_id_column is not None and not confluent:
        raise ValueError("schema_id_column needs confluent=True (the ids are in the header)")
    writer = parse_schema(schema)
    reader = None if reader_schema is None else parse_schema(reader_schema)
    if reader is not None:
        # resolution needs NumPy (the avro extra), which decoding without a reader does not:
        # imported when a reader's schema asks for it. The fields the reader drops are read
        # past, never decoded.
        from arrowstash.avro.resolve import pruned, resolve

        writer = pruned(writer, reader)
    batch, ids = decode_messages(
        messages, writer, threads=threads, confluent=confluent, validate_utf8=validate_utf8
    )
    if reader is not None:
        batch = resolve(batch, writer, reader)
    if schema_id_column is not None:
        if schema_id_column in batch.schema.names:
            raise ValueError(f"schema_id_column {schema_id_column!r} is already a column")
        batch = batch.append_column(pa.field(schema_id_column, pa.int32(), nullable=False), ids)
    return batch
