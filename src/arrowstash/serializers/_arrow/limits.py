"""How many bytes a compressed Arrow IPC stream will decompress to, read from its messages'
metadata before any buffer is decompressed: a forged 130 KB zstd stream can otherwise declare a
4 GB column, and the IPC reader allocates whatever a buffer's length prefix says.

Only the few fields needed are read from each message's FlatBuffers metadata (the record batch's
buffer table and whether it is compressed); every read is bounds-checked, and the walk costs time
proportional to the metadata's size. Row counts are bounded too: a stream of a few hundred
bytes can declare a column of a billion nulls, which costs nothing to read and gigabytes to
convert.
"""

from __future__ import annotations

import struct

from arrowstash.errors import CorruptEntryError

_RECORD_BATCH, _DICTIONARY_BATCH = 3, 4
_U16, _U32, _I32, _I64 = (struct.Struct(f"<{c}") for c in "HIiq")


class _Table:
    """A FlatBuffers table: its fields by index, absent ones as None."""

    __slots__ = ("_data", "_end", "_pos", "_vtable")

    def __init__(self, data: bytes, pos: int) -> None:
        self._data, self._pos = data, pos
        self._vtable = pos - _I32.unpack_from(data, pos)[0]
        self._end = _U16.unpack_from(data, self._vtable)[0]

    def _at(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot + 2 > self._end:
            return None
        offset: int = _U16.unpack_from(self._data, self._vtable + slot)[0]
        return self._pos + offset if offset else None

    def scalar(self, index: int, kind: struct.Struct, default: int = 0) -> int:
        at = self._at(index)
        return default if at is None else int(kind.unpack_from(self._data, at)[0])

    def table(self, index: int) -> _Table | None:
        at = self._at(index)
        return None if at is None else _Table(self._data, at + _U32.unpack_from(self._data, at)[0])

    def structs(self, index: int, size: int) -> tuple[int, int]:
        """Where a vector of ``size``-byte structs starts, and its length."""
        at = self._at(index)
        if at is None:
            return 0, 0
        start = at + _U32.unpack_from(self._data, at)[0]
        count: int = _U32.unpack_from(self._data, start)[0]
        if start + 4 + count * size > len(self._data):
            raise struct.error("vector past the end of the metadata")
        return start + 4, count


def _batch_bytes(data: bytes, body: memoryview) -> int:
    """Bytes the record batch described by the message metadata ``data`` (its body in
    ``body``) may take once loaded: what its compressed buffers declare they decompress to,
    and 8 bytes per value of every column (what widening packed integers or converting to
    pandas allocates, even for a column with no buffers, such as nulls)."""
    root = _Table(data, _U32.unpack_from(data, 0)[0])
    kind = root.scalar(1, struct.Struct("<B"))
    if kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return 0
    batch = root.table(2)
    if kind == _DICTIONARY_BATCH and batch is not None:
        batch = batch.table(1)
    if batch is None:
        return 0
    start, count = batch.structs(1, 16)  # FieldNode: length, null count
    total = 0
    for i in range(count):
        values: int = _I64.unpack_from(data, start + 16 * i)[0]
        if values < 0:
            raise struct.error(f"a column declares {values} values")
        total += 8 * values
    if batch.table(3) is None:  # no BodyCompression: the buffers are views of the stream
        return total
    start, count = batch.structs(2, 16)  # Buffer: offset, length
    for i in range(count):
        offset, length = struct.unpack_from("<qq", data, start + 16 * i)
        if length < 8:
            continue
        if offset < 0 or offset + 8 > len(body):
            raise struct.error("buffer outside the message body")
        declared: int = _I64.unpack_from(body, offset)[0]
        if declared < -1:
            raise struct.error(f"buffer declares {declared} bytes")
        total += length - 8 if declared == -1 else declared
    return total


def check_expansion(stream: memoryview, limit: int) -> None:
    """Raise CorruptEntryError if the IPC ``stream`` may take more than ``limit`` bytes once
    loaded (or its framing or metadata is malformed). Walks the stream's framing itself
    (continuation marker, metadata length, metadata, body), a few microseconds a message."""
    view = stream.cast("B") if stream.format != "B" else stream
    position, end, total = 0, view.nbytes, 0
    try:
        while position + 8 <= end:
            marker, length = struct.unpack_from("<Ii", view, position)
            if marker != 0xFFFFFFFF:
                raise struct.error("no continuation marker")
            position += 8
            if length == 0:  # end of stream
                return
            if length < 0 or position + length > end:
                raise struct.error("message metadata outside the stream")
            data = bytes(view[position : position + length])
            position += length
            body_length = _Table(data, _U32.unpack_from(data, 0)[0]).scalar(3, _I64)
            if body_length < 0 or position + body_length > end:
                raise struct.error("message body outside the stream")
            total += _batch_bytes(data, view[position : position + body_length])
            position += body_length
            if total > limit:
                raise CorruptEntryError(
                    f"Arrow stream declares more than {limit} bytes once decompressed (the "
                    "limit is ARROWSTASH_MAX_VALUE_BYTES, see docs/configuration.md)")
    except struct.error as exc:
        raise CorruptEntryError(f"unreadable Arrow IPC stream: {exc}") from exc
