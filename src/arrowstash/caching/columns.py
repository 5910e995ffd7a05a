"""Content hashing of arrays and frames for cache keys, without importing their libraries.

Each column is hashed from its buffers, so equal frames hash equally whatever their block layout
or chunking. A module's objects are only recognised when that module is already imported.
"""

from __future__ import annotations

from typing import Any


def hash_into(hasher: Any, obj: Any) -> bool:
    """Feed ``obj`` to ``hasher`` if it is an array or frame we know; return whether it was."""
    module = type(obj).__module__.partition(".")[0]
    if module == "numpy" and hasattr(obj, "__array_interface__"):
        _numpy(hasher, obj)
    elif module == "pandas":
        _pandas(hasher, obj)
    elif module == "polars" and hasattr(obj, "to_arrow"):
        hasher.tag(b"P" + type(obj).__name__.encode())
        _arrow(hasher, obj.to_arrow())
    elif module == "pyarrow":
        _arrow(hasher, obj)
    else:
        return False
    return True


def _numpy(hasher: Any, array: Any) -> None:
    import numpy as np

    if array.dtype.hasobject:
        hasher.tag(b"O", repr(array.shape).encode())
        for item in array.ravel(order="K"):
            hasher.value(item.item() if hasattr(item, "item") else item)
        return
    contiguous = np.ascontiguousarray(array)
    hasher.tag(b"A", f"{array.dtype.str}|{array.shape}".encode())
    hasher.h.update(contiguous.data.cast("B"))


def _pandas(hasher: Any, obj: Any) -> None:
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        hasher.tag(b"F", str(obj.shape).encode())
        _pandas_index(hasher, obj.columns)
        _pandas_index(hasher, obj.index)
        for position in range(obj.shape[1]):
            _series_values(hasher, obj.iloc[:, position])
    elif isinstance(obj, pd.Series):
        hasher.tag(b"S")
        hasher.value(obj.name)
        _pandas_index(hasher, obj.index)
        _series_values(hasher, obj)
    elif isinstance(obj, pd.Index):
        _pandas_index(hasher, obj)
    else:
        raise TypeError(f"pandas {type(obj).__qualname__}")


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
    import numpy as np

    dtype = values.dtype
    hasher.tag(b"t", str(dtype).encode())
    if isinstance(dtype, np.dtype) and not dtype.hasobject:
        _numpy(hasher, values.to_numpy())
        return
    import pyarrow as pa

    try:
        array = pa.array(values, from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError):
        for item in values.tolist():
            hasher.value(item)
        return
    _arrow(hasher, array)


def _arrow(hasher: Any, obj: Any) -> None:
    import pyarrow as pa

    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        hasher.tag(b"R", str(obj.num_rows).encode())
        hasher.value(obj.schema.names)
        for column in obj.columns:
            _arrow(hasher, column)
    elif isinstance(obj, (pa.ChunkedArray, pa.Array)):
        chunks = obj.chunks if isinstance(obj, pa.ChunkedArray) else [obj]
        hasher.tag(b"C", f"{_type_name(obj.type)}|{len(obj)}|{obj.null_count}".encode())
        _arrow_chunks(hasher, chunks, with_validity=obj.null_count > 0)
    elif isinstance(obj, pa.Scalar):
        hasher.tag(b"c", str(obj.type).encode())
        hasher.value(obj.as_py())
    else:
        raise TypeError(f"pyarrow {type(obj).__qualname__}")


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


def _arrow_chunks(hasher: Any, chunks: list[Any], with_validity: bool) -> None:
    """Hash an array's chunks as one stream per kind of buffer (validity, values; lengths, then
    bytes for strings), so that where the chunks split does not change the digest."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if with_validity:
        for chunk in chunks:
            hasher.h.update(np.asarray(chunk.is_valid()).tobytes())
    chunks = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in chunks]
    if not chunks:
        return
    t = chunks[0].type
    if pa.types.is_boolean(t):
        for chunk in chunks:
            hasher.h.update(np.asarray(chunk.fill_null(False)).tobytes())
    elif (pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t)) and t.bit_width % 8 == 0:
        if pa.types.is_primitive(t):
            zero = pa.scalar(0).cast(t)
        else:
            zero = pa.scalar(bytes(t.byte_width), t)
        width = t.bit_width // 8
        for chunk in chunks:
            if chunk.null_count:
                chunk = chunk.fill_null(zero)
            data = memoryview(chunk.buffers()[1])
            hasher.h.update(data[chunk.offset * width : (chunk.offset + len(chunk)) * width])
    elif t in (pa.string(), pa.binary(), pa.large_string(), pa.large_binary(),
               pa.string_view(), pa.binary_view()):
        large = [chunk.cast(pa.large_binary()) for chunk in chunks]
        for chunk in large:
            lengths = np.asarray(pc.binary_length(chunk).fill_null(0)).astype("<i8")
            hasher.h.update(lengths.tobytes())
        for chunk in large:
            offsets = np.frombuffer(chunk.buffers()[1], dtype="<i8")
            offsets = offsets[chunk.offset : chunk.offset + len(chunk) + 1]
            data = chunk.buffers()[2]
            if data is not None and len(offsets):
                hasher.h.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
    else:  # nested and other types: hash their Python values
        for chunk in chunks:
            for item in chunk.to_pylist():
                hasher.value(item)
