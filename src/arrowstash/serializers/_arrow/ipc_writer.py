"""Compressed Arrow IPC record batch messages, built here instead of by pyarrow's writer.

pyarrow's IPC writer allocates its compressed buffers from the default memory pool (mimalloc in
the wheels), which keeps freed pages per thread: storing a 63 MB frame with zstd peaked at
+23 MB of resident memory although Arrow's own allocations never passed 9 MB. Here each buffer
is compressed with ``Codec.compress`` into a pool we choose (the system allocator, which hands
large blocks back when they are freed), so a store's memory is its working set. The messages
follow the Arrow IPC specification (Message.fbs, Schema.fbs): a flatbuffer ``Message`` holding
a ``RecordBatch`` (or a ``DictionaryBatch``) with ``BodyCompression`` BUFFER, each body buffer an
8-byte little-endian uncompressed length (-1: stored as it is) and its compressed bytes. The
schema message still comes from pyarrow (``Schema.serialize``).

Only flat columns are written this way: fixed-width values, (large) strings and binaries, and
dictionaries of those. :func:`supported` says which; other tables go through pyarrow's writer.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

#: The continuation marker and zero length that end a stream.
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"

_CODECS = {"lz4": 0, "zstd": 1}  # CompressionType: LZ4_FRAME, ZSTD
_V5 = 4  # MetadataVersion
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3  # MessageHeader union
_STRINGS = {pa.string(): 4, pa.binary(): 4, pa.large_string(): 8, pa.large_binary(): 8}
_PADS = [bytes(k) for k in range(8)]
#: Buffers this large are sampled first and stored as they are if they do not compress.
_SAMPLED_FROM = 1 << 20
_SAMPLE = 64 << 10


def supported(t: pa.DataType) -> bool:
    """Can columns of type ``t`` be written here?"""
    if isinstance(t, pa.DictionaryType):
        return pa.types.is_integer(t.index_type) and _flat(t.value_type)
    return _flat(t)


def _flat(t: pa.DataType) -> bool:
    if t in _STRINGS:
        return True
    if isinstance(t, pa.ExtensionType) or pa.types.is_null(t):
        return False
    try:
        return bool(t.bit_width > 0 and t.num_fields == 0)
    except ValueError:  # not fixed-width
        return False


class BatchWriter:
    """Writes the messages of record batches (after a schema from ``Schema.serialize``, which
    numbers the dictionary columns 0, 1, ... in field order) as a list of pieces."""

    def __init__(self, codec: pa.Codec, pool: pa.MemoryPool) -> None:
        self._codec = codec
        self._codec_id = _CODECS[codec.name]
        self._pool = pool

    def batch(self, columns: Iterable[pa.Array], length: int) -> list[Any]:
        """The messages of one record batch of ``columns`` (each of ``length`` rows): a
        dictionary batch per dictionary column, then the record batch. ``columns`` may be made
        lazily: each is compressed, and dropped, before the next is asked for."""
        pieces: list[Any] = []
        body = _Body(self._codec, self._pool)
        dictionary_id = -1
        for column in columns:
            if len(column) != length:
                raise ValueError(f"a column of {len(column)} rows in a batch of {length}")
            if isinstance(column, pa.DictionaryArray):
                dictionary_id += 1
                values = _Body(self._codec, self._pool)
                values.add(self._plain(column.dictionary))
                pieces += self._message(values, len(column.dictionary), dictionary_id)
                column = column.indices
            body.add(self._plain(column))
            del column  # before the next is made
        pieces += self._message(body, length, None)
        return pieces

    def _plain(self, array: pa.Array) -> tuple[int, int, list[Any]]:
        """An array's length, null count and buffers (validity first), cut to its rows."""
        if array.offset and not _aligned(array):
            array = pa.concat_arrays([array], memory_pool=self._pool)  # an offset-0 copy
        n, start, t = len(array), array.offset, array.type
        buffers = array.buffers()
        nulls = array.null_count
        validity = buffers[0].slice(start // 8, -(-n // 8)) if nulls and n else None
        if t in _STRINGS:
            width = _STRINGS[t]
            offsets = buffers[1]
            end = struct.unpack_from("<i" if width == 4 else "<q", offsets, n * width)[0] \
                if n else 0
            data = buffers[2].slice(0, end) if buffers[2] is not None else None
            return n, nulls, [validity, offsets.slice(0, (n + 1) * width) if n else None, data]
        bits = t.bit_width
        if bits == 1:
            values = buffers[1].slice(start // 8, -(-n // 8))
        else:
            values = buffers[1].slice(start * bits // 8, n * bits // 8)
        return n, nulls, [validity, values]

    def _message(self, body: _Body, length: int, dictionary_id: int | None) -> list[Any]:
        batch = _record_batch(length, body.nodes, body.buffers, self._codec_id)
        if dictionary_id is None:
            header, kind = batch, _RECORD_BATCH
        else:
            header, kind = _Table([(8, struct.pack("<q", dictionary_id)), (4, batch)]), \
                _DICTIONARY_BATCH
        metadata = _finish(_Table([(2, struct.pack("<h", _V5)), (1, bytes([kind])),
                                   (4, header), (8, struct.pack("<q", body.size))]))
        metadata += _PADS[-len(metadata) % 8]
        return [b"\xff\xff\xff\xff" + struct.pack("<i", len(metadata)) + metadata, *body.pieces]


def _aligned(array: pa.Array) -> bool:
    """Can ``array``'s buffers be cut to its rows without moving bits?"""
    t = array.type
    if t in _STRINGS:
        return False  # its offsets would need rebasing
    bits_at_offset = array.offset % 8 == 0
    return bits_at_offset or (t.bit_width % 8 == 0 and not array.null_count)


class _Body:
    """The compressed buffers of a message body and their field nodes and buffer entries."""

    def __init__(self, codec: pa.Codec, pool: pa.MemoryPool) -> None:
        self._codec, self._pool = codec, pool
        self.nodes: list[tuple[int, int]] = []
        self.buffers: list[tuple[int, int]] = []
        self.pieces: list[Any] = []
        self.size = 0

    def _hopeless(self, buffer: pa.Buffer) -> bool:
        """Would compressing this large buffer save under 5%? Judged from three samples (its
        start, middle and end): random floats, say, cost zstd about 1.4 ms a megabyte to save
        4%, and a hit as much again to decompress them."""
        if buffer.size < _SAMPLED_FROM:
            return False
        for at in (0, (buffer.size - _SAMPLE) // 2, buffer.size - _SAMPLE):
            sample = buffer.slice(at, _SAMPLE)
            if self._codec.compress(sample, memory_pool=self._pool).size < _SAMPLE * 0.95:
                return False
        return True

    def add(self, plain: tuple[int, int, list[Any]]) -> None:
        length, nulls, buffers = plain
        self.nodes.append((length, nulls))
        for buffer in buffers:
            if buffer is None or buffer.size == 0:
                self.buffers.append((self.size, 0))
                continue
            packed = None if self._hopeless(buffer) else \
                self._codec.compress(buffer, memory_pool=self._pool)
            if packed is not None and packed.size < buffer.size:
                # The result has room for the worst case (about the input's size) and its
                # buffer protocol still says so: give the room back, and slice, so that what
                # is held until it is written, and what is written, are the compressed bytes.
                packed.resize(packed.size, shrink_to_fit=True)
                prefix, data = struct.pack("<q", buffer.size), packed.slice(0, packed.size)
            else:  # incompressible: the bytes as they are
                prefix, data = struct.pack("<q", -1), buffer
            del packed
            size = 8 + data.size
            self.pieces += [prefix, data]
            pad = -size % 8
            if pad:
                self.pieces.append(_PADS[pad])
            self.buffers.append((self.size, size))
            self.size += size + pad


# -- flatbuffers ------------------------------------------------------------------------------
# A table is built as a list of fields (alignment, bytes or a nested table) and laid out front
# to back: its vtable, then the table (an int32 back to the vtable and its fields), then the
# objects its fields point to, each offset pointing forward, as flatbuffers allows.


class _Table:
    """A table's fields, in field-id order: (width, bytes), (4, _Table) or (4, ("vector",
    bytes)), the latter two written as offsets to the object."""

    __slots__ = ("fields",)

    def __init__(self, fields: list[tuple[int, Any]]) -> None:
        self.fields = fields


def _vector(items: list[tuple[int, int]]) -> bytes:
    """A vector of 16-byte structs of two int64 (FieldNode, Buffer)."""
    return struct.pack(f"<I{2 * len(items)}q", len(items), *(v for item in items for v in item))


def _record_batch(length: int, nodes: list[tuple[int, int]], buffers: list[tuple[int, int]],
                  codec_id: int) -> _Table:
    compression = _Table([(1, bytes([codec_id])), (1, b"\x00")])  # codec, method BUFFER
    return _Table([(8, struct.pack("<q", length)), (4, ("vector", _vector(nodes))),
                   (4, ("vector", _vector(buffers))), (4, compression)])


def _finish(root: _Table) -> bytearray:
    out = bytearray(8)  # the root offset, patched below, and room to align
    struct.pack_into("<I", out, 0, _write(out, root))
    return out


def _align(out: bytearray, alignment: int, shift: int = 0) -> None:
    out += bytes(-(len(out) + shift) % alignment)


def _write(out: bytearray, table: _Table) -> int:
    """Append ``table`` (and what it points to) to ``out``; return where the table starts."""
    # fields are placed in the order given, each aligned, after the 4-byte vtable offset
    layout, size = [], 4
    for alignment, _ in table.fields:
        width = alignment
        size += -size % alignment
        layout.append(size)
        size += width
    vtable = struct.pack(f"<HH{len(layout)}H", 4 + 2 * len(layout), size, *layout)
    _align(out, 2)
    vtable_at = len(out)
    out += vtable
    _align(out, 8)  # fields of up to 8 bytes are aligned relative to the table's start
    table_at = len(out)
    out += bytes(size)
    struct.pack_into("<i", out, table_at, table_at - vtable_at)
    for (alignment, value), at in zip(table.fields, layout, strict=True):
        if isinstance(value, bytes):
            out[table_at + at : table_at + at + alignment] = value
            continue
        if isinstance(value, _Table):
            target = _write(out, value)
        else:  # ("vector", bytes): its length at 4 mod 8 so that the 8-byte structs align
            _align(out, 8, 4)
            target = len(out)
            out += value[1]
        struct.pack_into("<I", out, table_at + at, target - (table_at + at))
    return table_at
