"""Content hashing of arrays and frames for cache keys, without importing their libraries.

Each column is hashed from its buffers, so equal frames hash equally whatever their block layout
or chunking. A module's objects are only recognised when that module is already imported.
"""

from __future__ import annotations

import functools
import itertools
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
        _strings(hasher, chunks, nulls)
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


def _strings(hasher: Any, chunks: list[Any], nulls: list[Any]) -> None:
    """Strings and binaries from their offsets and data buffers as they lie: the lengths (one
    subtraction over the offsets, as 64-bit numbers whatever the offsets' width) and the bytes,
    each in a stream of its own. Types are looked at once, not per chunk: a column read from a
    CSV file comes in dozens of chunks."""
    import numpy as np
    import pyarrow as pa

    t = chunks[0].type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        t = pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()
        chunks = [chunk.cast(t) for chunk in chunks]
    width = np.dtype("<i8" if pa.types.is_large_string(t) or pa.types.is_large_binary(t)
                     else "<i4")
    lengths_h, data_h = xxhash.xxh3_128(), xxhash.xxh3_128()
    lengths = np.empty(max(map(len, chunks)), "<i8")
    for chunk, null in zip(chunks, nulls, strict=True):
        size = len(chunk)
        if not size:
            continue
        _, offsets_buffer, data = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, width, size + 1, chunk.offset * width.itemsize)
        own = lengths[:size]
        np.subtract(offsets[1:], offsets[:-1], out=own)
        if null is not None and own[null].any():  # a null slot with bytes in it
            blank = "" if pa.types.is_string(t) or pa.types.is_large_string(t) else b""
            chunk = chunk.fill_null(blank)
            _, offsets_buffer, data = chunk.buffers()
            offsets = np.frombuffer(offsets_buffer, width, size + 1, chunk.offset * width.itemsize)
            np.subtract(offsets[1:], offsets[:-1], out=own)
        lengths_h.update(own.data)
        if data is not None:
            data_h.update(memoryview(data)[offsets[0] : offsets[-1]])
    hasher.h.update(lengths_h.digest() + data_h.digest())


_STRING_NAMES = ("string", "binary", "large_string", "large_binary", "string_view", "binary_view")


def _is_string(t: Any) -> bool:
    import pyarrow as pa

    return any(getattr(pa.types, f"is_{name}")(t) for name in _STRING_NAMES)
