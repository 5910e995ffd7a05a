"""Content hashing of arrays and frames for cache keys, without importing their libraries.

Each column is hashed from its buffers, so equal frames hash equally whatever their block layout
or chunking. A module's objects are only recognised when that module is already imported.
"""

from __future__ import annotations

import functools
import importlib
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
    """The bytes of fixed-width values: a contiguous array as it is (a view costs more than
    the hash of a short column), else a contiguous copy; datetimes viewed as bytes, since
    their buffer cannot be exported."""
    import numpy as np

    if isinstance(values, np.ndarray) and values.flags.c_contiguous \
            and values.dtype.kind not in "mM":
        return values
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
    manager, width = frame._mgr, frame.shape[1]
    blocks, owner, row = manager.blocks, manager.blknos, manager.blklocs  # cached by pandas
    names = [_dtype_name(block.dtype) for block in blocks]
    hasher.tag(b"t", "\0".join([names[number] for number in owner.tolist()]).encode())
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
                _values(hasher, manager.iget_values(position))


#: The names of the dtypes seen, by identity (equal dtypes can print differently, and a name
#: is part of keys): a frame's blocks mostly share a few dtype objects.
_DTYPE_NAMES: dict[int, tuple[Any, str]] = {}


def _dtype_name(dtype: Any) -> str:
    held = _DTYPE_NAMES.get(id(dtype))
    if held is not None and held[0] is dtype:
        return held[1]
    if len(_DTYPE_NAMES) >= 256:
        _DTYPE_NAMES.clear()
    name = str(dtype)
    _DTYPE_NAMES[id(dtype)] = (dtype, name)  # holding the dtype keeps its id from being reused
    return name


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
    """A column (a Series, an Index, or the array behind them): its type, then its values
    (an extension array as it is: what ``pa.array`` would convert, without its dispatch)."""
    import numpy as np

    dtype = values.dtype
    hasher.tag(b"t", str(dtype).encode())
    _values(hasher, values if isinstance(dtype, np.dtype) else getattr(values, "array", values))


def _values(hasher: Any, values: Any) -> None:
    """A column's values: NumPy numbers as their bytes (the column's type and length are
    hashed before), anything else through Arrow (an extension array's own ``__arrow_array__``,
    what ``pa.array`` would call, minus its dispatch), else one by one."""
    import numpy as np

    dtype = values.dtype
    if isinstance(dtype, np.dtype) and not dtype.hasobject:
        hasher.h.update(_raw(values))
        return
    import pyarrow as pa

    to_arrow = getattr(values, "__arrow_array__", None)
    try:
        array = to_arrow() if to_arrow is not None else pa.array(values, from_pandas=True)
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
    (and so do the binary ones)."""
    kind = _kinds().get(t.id)
    return kind[1] if kind else str(t)


@functools.cache
def _kinds() -> dict[int, tuple[str, str]]:
    """By Arrow type id, the types keyed as strings: how they are read, and the name keys use."""
    import pyarrow as pa

    kinds = {pa.string().id: ("offsets", "string"), pa.large_string().id: ("offsets", "string"),
             pa.binary().id: ("offsets", "binary"), pa.large_binary().id: ("offsets", "binary")}
    if hasattr(pa, "string_view"):  # pyarrow 16
        kinds[pa.string_view().id] = ("view", "string")
        kinds[pa.binary_view().id] = ("view", "binary")
    return kinds


def _column(hasher: Any, obj: Any) -> None:
    """An array's values as one stream whatever its chunking, slicing, offset width or
    dictionary encoding: where the nulls are, then the values (a null's slot hashed as zeros)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_dictionary(obj.type):
        chunks = obj.chunks if isinstance(obj, pa.ChunkedArray) else [obj]
        obj = pa.chunked_array([chunk.dictionary_decode() for chunk in chunks], obj.type.value_type)
    t = obj.type
    hasher.tag(b"C", f"{_type_name(t)}|{len(obj)}|{obj.null_count}".encode())
    kind = _kinds().get(t.id, ("",))[0]
    if kind:
        if kind == "view":
            obj = obj.cast(pa.large_binary() if pa.types.is_binary_view(t) else pa.large_string())
        hasher.h.update(string_digests(obj, _native is not None))
        return
    chunks = obj.chunks if isinstance(obj, pa.ChunkedArray) else [obj]
    nulls = _nulls(hasher, chunks) if obj.null_count else [None] * len(chunks)
    if not len(obj) or pa.types.is_null(t):
        return
    if pa.types.is_boolean(t):
        for chunk in chunks:
            hasher.h.update(np.asarray(chunk.fill_null(False)).tobytes())
    elif (pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t)) and t.bit_width % 8 == 0:
        for chunk, null in zip(chunks, nulls, strict=True):
            hasher.h.update(_fixed_width(chunk, null))
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


def string_digests(obj: Any, native: bool) -> bytes:
    """The digests of a string or binary array's length stream and data stream (described in
    ``_lengths.c``), by the C helper (through Arrow's C interfaces: one call for a whole
    chunked array where pyarrow exports one as a stream, else one per chunk) or by its NumPy
    twin, which gives the same digests."""
    import pyarrow as pa

    lengths_h, data_h = xxhash.xxh3_128(), xxhash.xxh3_128()
    if native:
        stream = getattr(obj, "__arrow_c_stream__", None)  # ChunkedArray, pyarrow 16
        if stream is not None:
            _native(stream(), lengths_h.update, data_h.update)
        else:
            for chunk in obj.chunks if isinstance(obj, pa.ChunkedArray) else [obj]:
                _native(chunk.__arrow_c_array__(), lengths_h.update, data_h.update)
    else:
        _streams_numpy(obj, lengths_h.update, data_h.update)
    return lengths_h.digest() + data_h.digest()


def _streams_numpy(obj: Any, lengths: Any, data: Any) -> None:
    """The twin of the C helper: each chunk's length stream, then its bytes less the bytes its
    null slots span."""
    import numpy as np
    import pyarrow as pa

    wide = pa.types.is_large_string(obj.type) or pa.types.is_large_binary(obj.type)
    for chunk in obj.chunks if isinstance(obj, pa.ChunkedArray) else [obj]:
        size, first = len(chunk), chunk.offset
        if not size:
            continue
        validity, offsets, values = chunk.buffers()
        o = np.frombuffer(offsets, "<i8" if wide else "<i4", size + 1, first * (8 if wide else 4))
        n: Any = np.diff(o.astype(np.int64))
        valid = np.ones(size, bool)
        if validity is not None and chunk.null_count:
            bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")
            valid = bits[first : first + size].astype(bool)
        long = valid & (n >= _NULL_CODE)
        stream = np.where(valid, np.where(long, _LONG_CODE, n), _NULL_CODE).astype(np.uint8)
        if long.any():  # each long value's code is followed by its 8-byte length
            ends = np.cumsum(np.where(long, 9, 1))
            escaped = np.empty(int(ends[-1]), np.uint8)
            escaped[ends - np.where(long, 9, 1)] = stream
            escaped[(ends[long] - 8)[:, None] + np.arange(8)] = \
                n[long].astype("<u8").view(np.uint8).reshape(-1, 8)
            stream = escaped
        lengths(stream)
        raw: Any = np.frombuffer(values, np.uint8)[o[0] : o[-1]] if values is not None else b""
        if (~valid & (n > 0)).any():
            raw = raw[np.repeat(valid, n)]
        data(raw)


#: The length stream's codes: a null, and a value of 254 bytes or more (its length follows).
_NULL_CODE, _LONG_CODE = 254, 255

_native: Any
try:  # the C helper; absent where the package was installed without a C compiler
    _native = importlib.import_module("arrowstash.caching._lengths").column
except ImportError:  # pragma: no cover - depends on the build
    _native = None
