"""pandas frames of plain columns under a RangeIndex, converted column by column.

Most cached frames are like this: string labels, a RangeIndex, NumPy numbers, booleans and
naive datetimes, pandas strings and nullable numbers. For them pyarrow's generic pandas
conversion (its metadata JSON, dtype inference, a block manager walk each way) is most of the
per-call cost of a small frame. Here each column becomes an Arrow array directly, a small plan
(labels, dtype names, the range) travels in the entry's metadata instead of Arrow's pandas
metadata, and a hit builds the frame from its blocks: NumPy columns as writable views of memory
the result may use (see :func:`_numpy_column`), the others through their dtype's
``__from_arrow__``. Anything else takes the general path in _pandas.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import pyarrow as pa

from arrowstash.serializers._arrow.batches import Source

#: NumPy kinds stored as Arrow arrays and viewed back: ints, unsigned, floats, bools, datetime64
#: and timedelta64 (naive).
_NUMPY_KINDS = frozenset("iufbmM")


def plain_source(df: Any) -> Source | None:
    """``df`` as a plain table and its plan, or None if it is not plain."""
    pd = sys.modules["pandas"]
    index, columns = df.index, df.columns
    if type(index) is not pd.RangeIndex or type(columns) is not pd.Index or \
            columns.name is not None or not hasattr(df, "_iter_column_arrays"):
        return None
    labels = columns.tolist()
    if not all(type(label) is str for label in labels) or not columns.is_unique or \
            not (index.name is None or type(index.name) is str):
        return None
    arrays, dtypes = [], []
    for values in df._iter_column_arrays():
        dtype = values.dtype
        name = _plain_dtype(dtype)
        if name is None:
            return None
        try:
            arrays.append(pa.array(values) if name[0] == "n" else values.__arrow_array__())
        except (pa.ArrowException, TypeError, ValueError):
            return None
        dtypes.append(name)
    table = pa.Table.from_arrays(arrays, names=labels) if arrays else None
    if table is None:
        return None
    meta = {"plain": [labels, dtypes, [index.start, index.stop, index.step],
                      index.name, str(columns.dtype)]}
    return Source("pandas", table.schema, table.to_batches, meta, whole=lambda: table)


#: pandas extension dtypes converted through Arrow by their own ``__arrow_array__`` and
#: ``__from_arrow__``: strings, nullable numbers and booleans (and ``ArrowDtype``, by class).
_EXTENSION_NAMES = frozenset(
    ["str", "string", "boolean", "Float32", "Float64"]
    + [f"{sign}Int{bits}" for sign in ("", "U") for bits in (8, 16, 32, 64)]
)


@lru_cache(maxsize=256)
def _plain_dtype(dtype: Any) -> str | None:
    """"n<numpy dtype>" or "e<pandas dtype name>" for a dtype this module round-trips exactly
    (the name must give the same dtype back), else None."""
    import numpy as np

    if isinstance(dtype, np.dtype):
        ok = dtype.kind in _NUMPY_KINDS and dtype.isnative and not dtype.metadata
        return f"n{dtype.str}" if ok else None
    name = str(dtype)
    if name not in _EXTENSION_NAMES and type(dtype).__name__ != "ArrowDtype":
        return None
    import pandas as pd

    try:
        return f"e{name}" if pd.api.types.pandas_dtype(name) == dtype else None
    except TypeError:
        return None


@lru_cache(maxsize=256)
def _dtype_of(name: str) -> Any:
    if name[0] == "n":
        import numpy as np

        return np.dtype(name[1:])
    import pandas as pd

    return pd.api.types.pandas_dtype(name[1:])


def to_frame(table: pa.Table, plan: list[Any], sections: Sequence[memoryview]) -> Any:
    """The frame ``plan`` describes, from ``table`` (read from ``sections``)."""
    import numpy as np
    import pandas as pd

    labels, dtypes, (start, stop, step), index_name, columns_dtype = plan
    spans = [_span(section) for section in sections]
    blocks = []
    for position, (column, name) in enumerate(zip(table.columns, dtypes, strict=True)):
        dtype = _dtype_of(name)
        if name[0] == "n":
            values = _numpy_column(column, dtype, spans).reshape(1, -1)
        else:
            values = dtype.__from_arrow__(column)
        blocks.append((values, np.array([position])))
    index = pd.RangeIndex(start, stop, step, name=index_name)
    columns = pd.Index(labels, dtype=columns_dtype)
    return _from_blocks(blocks, index, columns)


def _span(section: memoryview) -> tuple[int, int, memoryview]:
    address = pa.py_buffer(section).address
    return address, address + section.nbytes, section


def _numpy_column(column: pa.ChunkedArray, dtype: Any, spans: list[tuple[int, int, memoryview]]
                  ) -> Any:
    """A writable NumPy array of ``column``, without a copy where the memory allows: a view of
    a writable (private) section, or of a buffer Arrow allocated for this read (decompressed);
    otherwise a copy (read-only sections, several chunks, nulls, bit-packed booleans)."""
    import numpy as np

    if column.num_chunks == 1 and not column.null_count and dtype.kind != "b":
        chunk = column.chunk(0)
        data = chunk.buffers()[1]
        address = data.address + chunk.offset * dtype.itemsize
        end = address + len(chunk) * dtype.itemsize
        for start, stop, section in spans:
            if start <= data.address < stop:
                if section.readonly or end > stop:
                    break
                return np.frombuffer(section, dtype, len(chunk), address - start)
        else:
            if data.is_mutable:
                return np.frombuffer(data, dtype, len(chunk), address - data.address)
    if not column.null_count and dtype.kind != "b":
        return np.concatenate([chunk.to_numpy() for chunk in column.chunks]) \
            if column.num_chunks else np.empty(0, dtype)
    values = column.to_numpy()
    return values if values.flags.writeable and values.dtype == dtype else \
        values.astype(dtype, copy=True)


def _from_blocks(blocks: list[tuple[Any, Any]], index: Any, columns: Any) -> Any:
    make = _frame_maker()
    if make is not None:
        return make(blocks, index=index, columns=columns)
    import pandas as pd  # pandas < 3: the public constructor, slower

    frame = pd.DataFrame({i: (v[0] if getattr(v, "ndim", 1) == 2 else v)
                          for i, (v, _) in enumerate(blocks)}, index=index, copy=False)
    frame.columns = columns
    return frame


@lru_cache(maxsize=1)
def _frame_maker() -> Any:
    """pandas 3's ``create_dataframe_from_blocks`` (what pyarrow itself uses), if present."""
    import importlib

    try:
        return importlib.import_module("pandas.api.internals").create_dataframe_from_blocks
    except (ImportError, AttributeError):
        return None
