"""Content hashing of arrays and frames for cache keys, without importing their libraries.

Each column is hashed from its buffers, so equal frames hash equally whatever their block layout
or chunking. A module's objects are only recognised when that module is already imported.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import threading
import weakref
from typing import Any

import xxhash


def hash_into(hasher: Any, obj: Any) -> bool:
    """Feed ``obj`` to ``hasher`` if it is an array or frame we know; return whether it was."""
    module = type(obj).__module__.partition(".")[0]
    if module == "numpy" and hasattr(obj, "__array_interface__"):
        _numpy(hasher, obj)
    elif module == "pandas":
        _pandas(hasher, obj)
    elif module == "polars" and hasattr(obj, "to_arrow"):
        hasher.tag(b"P" + type(obj).__name__.encode())
        _arrow_content(hasher, obj.to_arrow())  # a new object each time: not remembered
    elif module == "pyarrow":
        _arrow(hasher, obj)
    else:
        return False
    return True


def _numpy(hasher: Any, array: Any) -> None:

    if array.dtype.hasobject:
        hasher.tag(b"O", repr(array.shape).encode())
        for item in array.ravel(order="K"):
            hasher.value(item.item() if hasattr(item, "item") else item)
        return
    hasher.tag(b"A", f"{array.dtype.str}|{array.shape}".encode())
    hasher.h.update(_raw(array))


def _raw(values: Any) -> Any:
    """The bytes of fixed-width values (as bytes: a buffer of datetimes cannot be exported)."""
    import numpy as np

    return np.ascontiguousarray(values).reshape(-1).view(np.uint8)


def _pandas(hasher: Any, obj: Any) -> None:
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        _frame(hasher, obj)
    elif isinstance(obj, pd.Series):
        hasher.tag(b"S")
        hasher.value(obj.name)
        _pandas_index(hasher, obj.index)
        _series_values(hasher, obj)
    elif isinstance(obj, pd.Index):
        _pandas_index(hasher, obj)
    else:
        raise TypeError(f"pandas {type(obj).__qualname__}")


def _frame(hasher: Any, frame: Any) -> None:
    """Names, index and each column's type first, then the columns' values one after another.

    The values are read through pandas' block manager (pandas 2 and 3): a run of columns lying
    side by side in one NumPy block is hashed in one pass over the same bytes the columns would
    give one by one, which a frame of thousands of columns needs; other columns come without
    building a Series (which costs 20x more).
    """
    import numpy as np

    hasher.tag(b"F", str(frame.shape).encode())
    _pandas_index(hasher, frame.columns)
    _pandas_index(hasher, frame.index)
    blocks, width = frame._mgr.blocks, frame.shape[1]
    owner, row = np.empty(width, np.intp), np.empty(width, np.intp)
    dtypes = np.empty(width, object)
    for number, block in enumerate(blocks):
        where = block.mgr_locs.as_array
        owner[where], row[where], dtypes[where] = number, np.arange(len(where)), str(block.dtype)
    hasher.tag(b"t", "\0".join(dtypes).encode())
    if not width:
        return
    breaks = np.flatnonzero((owner[1:] != owner[:-1]) | (row[1:] != row[:-1] + 1)) + 1
    for start, stop in itertools.pairwise([0, *breaks.tolist(), width]):
        values = blocks[owner[start]].values
        if isinstance(values, np.ndarray) and not values.dtype.hasobject \
                and values.flags.c_contiguous:
            hasher.h.update(_raw(values[row[start] : row[start] + stop - start]))
        else:
            for position in range(start, stop):
                _values(hasher, frame._mgr.iget_values(position))


def _pandas_index(hasher: Any, index: Any) -> None:
    import pandas as pd

    hasher.tag(b"I", type(index).__name__.encode())
    hasher.value(list(index.names))
    if isinstance(index, pd.RangeIndex):
        hasher.value((index.start, index.stop, index.step))
    elif isinstance(index, pd.MultiIndex):
        for level in range(index.nlevels):
            _series_values(hasher, index.get_level_values(level))
    else:
        _series_values(hasher, index)


def _series_values(hasher: Any, values: Any) -> None:
    """A column (a Series, an Index, or the array behind them): its type, then its values."""
    hasher.tag(b"t", str(values.dtype).encode())
    _values(hasher, values)


def _values(hasher: Any, values: Any) -> None:
    """A column's values: NumPy numbers as their bytes (the column's type and length are
    hashed before), anything else through Arrow, else one by one."""
    import numpy as np

    dtype = values.dtype
    if isinstance(dtype, np.dtype) and not dtype.hasobject:
        hasher.h.update(_raw(values))
        return
    import pyarrow as pa

    try:
        array = pa.array(values, from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError):
        for item in values.tolist():
            hasher.value(item)
        return
    _column(hasher, array)


def _arrow(hasher: Any, obj: Any) -> None:
    import pyarrow as pa

    if isinstance(obj, pa.Scalar):
        hasher.tag(b"c", str(obj.type).encode())
        hasher.value(obj.as_py())
    elif isinstance(obj, (pa.Table, pa.RecordBatch, pa.ChunkedArray, pa.Array)):
        hasher.tag(b"r", _remembered(hasher, obj))
    else:
        raise TypeError(f"pyarrow {type(obj).__qualname__}")


#: Digests of the pyarrow objects hashed so far, by id, while they live (pyarrow's tables,
#: batches and arrays are immutable, so an object hashed once need not be hashed again).
_DIGESTS: dict[int, tuple[weakref.ref[Any], bytes]] = {}


def _remembered(hasher: Any, obj: Any) -> bytes:
    key = id(obj)
    held = _DIGESTS.get(key)
    if held is not None and held[0]() is obj:
        return held[1]
    sub = type(hasher)(b"")
    sub.where = hasher.where
    _arrow_content(sub, obj)
    digest: bytes = sub.h.digest()
    _DIGESTS[key] = (weakref.ref(obj, functools.partial(_forget, key)), digest)
    return digest


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    held = _DIGESTS.get(key)
    if held is not None and held[0] is ref:  # not an entry for a newer object of the same id
        del _DIGESTS[key]


def _arrow_content(hasher: Any, obj: Any) -> None:
    import pyarrow as pa

    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        hasher.tag(b"R", str(obj.num_rows).encode())
        hasher.value(obj.schema.names)
        for column in obj.columns:
            _column(hasher, column)
    else:
        _column(hasher, obj)


def _type_name(t: Any) -> str:
    """The type as a key sees it: string, large_string and string_view hold the same values
    (and so do the binary ones); a dictionary column is its values."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if t in (pa.large_string(), pa.string_view()):
        return "string"
    if t in (pa.large_binary(), pa.binary_view()):
        return "binary"
    return str(t)


def _column(hasher: Any, obj: Any) -> None:
    """An array's values as one stream whatever its chunking, slicing or offset width: where
    the nulls are, then the values (a null's slot hashed as zeros)."""
    import numpy as np
    import pyarrow as pa

    chunks = obj.chunks if isinstance(obj, pa.ChunkedArray) else [obj]
    hasher.tag(b"C", f"{_type_name(obj.type)}|{len(obj)}|{obj.null_count}".encode())
    if pa.types.is_dictionary(obj.type):
        chunks = [chunk.dictionary_decode() for chunk in chunks]
    has_nulls = any(chunk.null_count for chunk in chunks)  # after decoding: dictionaries' too
    nulls = _nulls(hasher, chunks) if has_nulls else [None] * len(chunks)
    if not len(obj) or pa.types.is_null(chunks[0].type):
        return
    t = chunks[0].type
    if pa.types.is_boolean(t):
        for chunk in chunks:
            hasher.h.update(np.asarray(chunk.fill_null(False)).tobytes())
    elif (pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t)) and t.bit_width % 8 == 0:
        for chunk, null in zip(chunks, nulls, strict=True):
            hasher.h.update(_fixed_width(chunk, null))
    elif _is_string(t):
        _strings(hasher, chunks)
    else:  # nested and other types: their Python values
        for chunk in chunks:
            for item in chunk.to_pylist():
                hasher.value(item)


def _nulls(hasher: Any, chunks: list[Any]) -> list[Any]:
    """Hash where the nulls are (positions in the whole array, read from one bitmap of the
    whole column: a pass per chunk would cost more than the bits); return each chunk's own."""
    import numpy as np
    import pyarrow as pa

    flags = pa.concat_arrays([chunk.is_null() for chunk in chunks])  # a set bit per null
    positions = _set_bits(flags.buffers()[1], flags.offset, len(flags))
    hasher.h.update(positions.astype("<i8"))
    starts = np.cumsum([0, *map(len, chunks)])
    cuts = np.searchsorted(positions, starts).tolist()
    return [positions[a:b] - start if b > a else None
            for a, b, start in zip(cuts, cuts[1:], starts.tolist(), strict=False)]


def _set_bits(bitmap: Any, offset: int, length: int) -> Any:
    """Positions of the set bits of a bitmap: only the bytes with a set bit are unpacked
    (cheap when they are few, as nulls mostly are)."""
    import numpy as np

    stop = offset + length
    bits = np.frombuffer(bitmap, np.uint8)[offset // 8 : (stop + 7) // 8]
    some = np.flatnonzero(bits != 0)  # 10x faster than on the bytes themselves
    set_ = np.unpackbits(bits[some, None], axis=1, bitorder="little").astype(bool)
    positions = ((some + offset // 8) * 8)[:, None] + np.arange(8)
    positions = positions[set_]
    return positions[(positions >= offset) & (positions < stop)] - offset


def _fixed_width(chunk: Any, null: Any) -> Any:
    """The bytes of a chunk's values as they lie; a copy with zeros in null slots only when a
    null slot holds something else."""
    import numpy as np
    import pyarrow as pa

    t = chunk.type
    width = t.bit_width // 8
    data = np.frombuffer(chunk.buffers()[1], np.uint8)[
        chunk.offset * width : (chunk.offset + len(chunk)) * width]
    if null is not None and data.reshape(len(chunk), width)[null].any():
        zero = pa.scalar(0).cast(t) if pa.types.is_primitive(t) else pa.scalar(bytes(width), t)
        return _fixed_width(chunk.fill_null(zero), None)
    return data


def _strings(hasher: Any, chunks: list[Any]) -> None:
    """Strings and binaries from their offsets and data buffers as they lie: the lengths and the
    bytes, each in a stream of its own. The lengths are 32-bit numbers whatever the offsets'
    width (string, large_string and string_view give one stream), unless a value is 2 GiB or
    longer, which only a large type can hold: then they are 64-bit, under another tag. Types
    are looked at once, not per chunk: a column read from a CSV file comes in dozens of chunks."""
    import pyarrow as pa

    t = chunks[0].type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        t = pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()
        chunks = [chunk.cast(t) for chunk in chunks]
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    blank = "" if pa.types.is_string(t) or pa.types.is_large_string(t) else b""
    try:
        digests = _string_streams(chunks, wide, blank, _lengths, "I")
    except _LongValue:
        hasher.tag(b"L")
        digests = _string_streams(chunks, wide, blank, _lengths_numpy, "q")
    hasher.h.update(digests)


class _LongValue(Exception):
    """A value of 2 GiB or more: its length does not fit the 32-bit stream."""


#: Values per call of the lengths helper: its output stays in the CPU's cache until hashed.
_BLOCK = 1 << 15

#: Each thread's buffer of 32-bit lengths (a new one per column cost a 128 KiB memset).
_SCRATCH = threading.local()


def _string_streams(chunks: list[Any], wide: bool, blank: Any, lengths: Any, kind: str) -> bytes:
    """The digests of the lengths (``kind``: "I" for 32-bit ones, "q" for 64-bit) and of the
    bytes, one chunk after another; a null slot's length is zero, and a chunk with a null slot
    spanning bytes is hashed as its copy with those slots emptied."""
    lengths_h: Any = xxhash.xxh3_128()
    data_h = xxhash.xxh3_128()
    out: Any = getattr(_SCRATCH, "out", None)
    if kind == "q":
        out = memoryview(bytearray(8 * _BLOCK)).cast("q")
    elif out is None:
        out = _SCRATCH.out = memoryview(bytearray(4 * _BLOCK)).cast("I")
    for chunk in chunks:
        if not len(chunk):
            continue
        saved = lengths_h.copy() if chunk.null_count else None
        fed = _chunk_lengths(chunk, wide, lengths, out, lengths_h)
        if fed is None:
            lengths_h, chunk = saved, chunk.fill_null(blank)
            fed = _chunk_lengths(chunk, wide, lengths, out, lengths_h)
        data, start, stop = fed
        if data is not None:
            data_h.update(memoryview(data)[start:stop])
    digests: bytes = lengths_h.digest() + data_h.digest()
    return digests


def _chunk_lengths(chunk: Any, wide: bool, lengths: Any, out: Any, lengths_h: Any) -> Any:
    """Feed a chunk's lengths to ``lengths_h`` a block at a time; return its data buffer and
    the span of it the chunk covers, or None when a null slot spans bytes."""
    validity, offsets, data = chunk.buffers()
    validity = validity if chunk.null_count else None
    size, first = len(chunk), chunk.offset
    start = stop = 0
    for at in range(0, size, _BLOCK):
        count = min(_BLOCK, size - at)
        begin, stop, spanned = lengths(offsets, first + at, count, wide, validity, out)
        if spanned:
            return None
        if out.format == "I" and stop - begin >= 1 << 31 and _longest(offsets, first + at, count):
            raise _LongValue
        lengths_h.update(out[:count])
        if not at:
            start = begin
    return data, start, stop


def _lengths_numpy(offsets: Any, first: int, count: int, wide: bool, validity: Any,
                   out: Any) -> tuple[int, int, int]:
    """The twin of the compiled ``_lengths.lengths`` (used where it was not built, and for
    64-bit lengths): each value's length into ``out`` (its width truncating, like the C
    one's), zero for a null slot; returns the first and last offsets and the bytes null slots
    spanned."""
    import numpy as np

    o = np.frombuffer(offsets, "<i8" if wide else "<i4", count + 1, first * (8 if wide else 4))
    own = np.frombuffer(out, "<u4" if out.itemsize == 4 else "<i8", count)
    np.subtract(o[1:], o[:-1], out=own, casting="unsafe")
    spanned = 0
    if validity is not None:
        bits = np.frombuffer(validity, np.uint8)[first // 8 : (first + count + 7) // 8]
        null = ~np.unpackbits(bits, bitorder="little")[first % 8 : first % 8 + count].astype(bool)
        spanned = int(own[null].sum())
        own[null] = 0
    return int(o[0]), int(o[-1]), spanned


_lengths: Any
try:  # the compiled twin; absent where the package was installed without a C compiler
    _lengths = importlib.import_module("arrowstash.caching._lengths").lengths
except ImportError:  # pragma: no cover - depends on the build
    _lengths = _lengths_numpy


def _longest(offsets: Any, first: int, count: int) -> bool:
    """Whether a value of a large chunk is 2 GiB or longer."""
    import numpy as np

    o = np.frombuffer(offsets, "<i8", count + 1, first * 8)
    return bool((np.diff(o) >> 31).any())


_STRING_NAMES = ("string", "binary", "large_string", "large_binary", "string_view", "binary_view")


def _is_string(t: Any) -> bool:
    import pyarrow as pa

    return any(getattr(pa.types, f"is_{name}")(t) for name in _STRING_NAMES)
