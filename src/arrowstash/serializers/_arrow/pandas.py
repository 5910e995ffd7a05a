"""pandas frames to Arrow and back, exactly: what Arrow's own pandas metadata does not restore
travels in the entry's metadata (see :func:`_pandas_meta`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from arrowstash.errors import SerializationError
from arrowstash.serializers._arrow.batches import Source, label_codec, rebatch, rows_per_batch
from arrowstash.serializers._arrow.plain_pandas import plain_source, to_frame


def from_pandas(df: Any, batch_bytes: int, split: bool) -> Source:
    plain = plain_source(df)
    if plain is not None:
        return plain
    if not df.columns.is_unique:
        duplicated = sorted({repr(c) for c in df.columns[df.columns.duplicated()]})
        raise SerializationError(f"duplicate column labels {', '.join(duplicated)}")
    object_columns = [i for i, dtype in enumerate(df.dtypes) if _numpy_kind(dtype) == "O"]
    for position in object_columns:
        _check_object_column(df, position)
    # Arrow wants unique, plain string field names; the real labels travel in the metadata.
    renamed = df.set_axis([f"c{i}" for i in range(df.shape[1])], axis=1) \
        if _needs_renaming(df.columns) else df
    try:
        schema = pa.Schema.from_pandas(renamed, preserve_index=None)
    except (pa.ArrowException, ValueError, TypeError, KeyError) as exc:
        raise SerializationError(f"{_which_column(df)}: {exc}") from exc
    meta = _pandas_meta(df, object_columns, renamed is not df)
    if object_columns:
        _check_round_trip(renamed, schema, meta, df)
    # NumPy float columns keep NaN as NaN (Arrow would make it null): exact, and it lets a hit
    # view the column without filling nulls back in.
    floats = [(schema.get_field_index(str(renamed.columns[i])), i)
              for i, dtype in enumerate(renamed.dtypes) if _numpy_kind(dtype) == "f"]

    def convert(part: Any) -> pa.Table:
        try:
            table = pa.Table.from_pandas(part, schema=schema, preserve_index=None)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise SerializationError(f"{_which_column(df)}: {exc}") from exc
        for field_index, position in floats:
            if table.column(field_index).null_count:
                values = pa.array(part.iloc[:, position].to_numpy(), from_pandas=False)
                table = table.set_column(field_index, schema.field(field_index), values)
        return table

    def batches_of(part: Any) -> list[pa.RecordBatch]:
        # a frame without rows still writes one (empty) batch: it carries the categories
        return convert(part).to_batches() or [
            pa.RecordBatch.from_pandas(part, schema=schema, preserve_index=None)
        ]

    def batches() -> Iterator[pa.RecordBatch]:
        if not object_columns:
            # numeric and Arrow-backed columns convert without copies: convert the frame once,
            # then slice it (compressed) or write it whole
            yield from rebatch(iter(batches_of(renamed)), batch_bytes if split else None)
            return
        # object columns are copied by the conversion: a slice at a time bounds that copy
        nbytes = int(df.memory_usage(index=True, deep=False).sum())
        step = rows_per_batch(nbytes, len(df), batch_bytes)
        for start in range(0, max(len(renamed), 1), step):
            yield from batches_of(renamed.iloc[start : start + step])

    whole = (lambda: convert(renamed)) if not object_columns and len(df) else None
    return Source("pandas", schema, batches, meta, whole)


def _pandas_meta(df: Any, object_columns: list[int], renamed: bool) -> dict[str, Any]:
    """What Arrow's own pandas metadata does not restore exactly: column labels (any hashable,
    MultiIndex, categorical), object dtypes, the dtypes of index levels (object, nullable with
    NA), the index's freq, and the length of a frame without columns."""
    import pandas as pd

    columns, index = df.columns, df.index
    meta: dict[str, Any] = {
        "labels": label_codec.pack(list(columns)),
        "names": label_codec.pack(list(columns.names)),
        "multi": isinstance(columns, pd.MultiIndex),
        "dtype": None if isinstance(columns, pd.MultiIndex) else str(columns.dtype),
        "renamed": renamed,
        "objects": object_columns,
    }
    if isinstance(columns, pd.CategoricalIndex):
        meta["categories"] = label_codec.pack(list(columns.categories))
        meta["ordered"] = bool(columns.ordered)
    meta["index_dtypes"] = [str(index.get_level_values(i).dtype) for i in range(index.nlevels)]
    if isinstance(index, pd.DatetimeIndex) and index.freq is not None:
        meta["freq"] = index.freqstr
    if df.shape[1] == 0 and isinstance(index, pd.RangeIndex):
        meta["range"] = [index.start, index.stop, index.step, label_codec.pack(index.name)]
    return meta


def _check_object_column(df: Any, position: int) -> None:
    """An object column reads back exactly only if its values are all of one type."""
    import pandas as pd

    column = df.iloc[:, position]
    kinds = {type(v) for v in column[~pd.isna(column)]} if len(column) else set()
    if len(kinds) > 1:
        names = ", ".join(sorted(k.__qualname__ for k in kinds))
        raise SerializationError(
            f"column {df.columns[position]!r} (dtype object) mixes {names} values, which would "
            "not read back as they are; convert the column to one typed dtype first"
        )


def _numpy_kind(dtype: Any) -> str | None:
    """The NumPy kind of a plain NumPy dtype; None for pandas extension dtypes (whose ``kind``
    mimics NumPy's: "O" for strings, "f" for nullable floats)."""
    import numpy as np

    return dtype.kind if isinstance(dtype, np.dtype) else None


def _needs_renaming(columns: Any) -> bool:
    """Anything but a plain Index of ordinary string labels travels in the metadata."""
    import pandas as pd

    return type(columns) is not pd.Index or not all(
        type(c) is str and not c.startswith("__") for c in columns
    )


def _which_column(df: Any) -> str:
    """Name the column Arrow cannot convert (its own messages do not always say)."""
    for position in range(df.shape[1]):
        try:
            pa.Array.from_pandas(df.iloc[:, position])
        except (pa.ArrowException, ValueError, TypeError):
            return f"column {df.columns[position]!r} (dtype {df.dtypes.iloc[position]})"
    return "frame"


def _check_round_trip(renamed: Any, schema: pa.Schema, meta: dict[str, Any], df: Any) -> None:
    """Refuse object columns whose values would come back as other types (lists as arrays,
    mixed objects coerced): a stored frame must read back exactly as it was."""
    import numpy as np
    import pandas as pd

    # the first non-null values of each object column (_check_object_column made sure each
    # column holds values of one type)
    rows = sorted({int(i) for p in meta["objects"]
                   for i in np.flatnonzero(~pd.isna(renamed.iloc[:, p]))[:20]})
    head = renamed.iloc[rows]
    back = to_pandas(pa.Table.from_pandas(head, schema=schema, preserve_index=None), meta, [])
    for position in meta["objects"]:
        before, after = head.iloc[:, position], back.iloc[:, position]
        for a, b in zip(before, after, strict=False):
            if type(a) is not type(b) and not (_is_na(a) and _is_na(b)):
                raise SerializationError(
                    f"column {df.columns[position]!r} (dtype object) holds "
                    f"{type(a).__qualname__} values that would read back as "
                    f"{type(b).__qualname__}; convert the column to a typed dtype first"
                )


def _is_na(value: Any) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def to_pandas(table: pa.Table, meta: dict[str, Any], sections: Sequence[memoryview]) -> Any:
    if "plain" in meta:
        return to_frame(table, meta["plain"], sections)
    table, owned = _owned_arrays(table, sections)
    df = _writable_frame(table.to_pandas(split_blocks=True), sections, owned)
    return _restore_pandas(df, meta) if meta else df


def _restore_pandas(df: Any, meta: dict[str, Any]) -> Any:
    """Undo what Arrow's pandas metadata cannot: see :func:`_pandas_meta`."""
    import pandas as pd

    if "range" in meta and df.shape[1] == 0:
        start, stop, step, name = meta["range"]
        df = pd.DataFrame(index=pd.RangeIndex(start, stop, step, name=label_codec.unpack(name)))
    for position in meta["objects"]:
        df.isetitem(position, df.iloc[:, position].astype(object))
    labels = label_codec.unpack(meta["labels"])
    names = label_codec.unpack(meta["names"])
    if meta["multi"]:
        df.columns = pd.MultiIndex.from_tuples(labels, names=names)
    elif "categories" in meta:
        df.columns = pd.CategoricalIndex(
            labels, categories=label_codec.unpack(meta["categories"]), ordered=meta["ordered"],
            name=names[0],
        )
    elif meta["renamed"] or str(df.columns.dtype) != meta["dtype"]:
        df.columns = pd.Index(labels, dtype=meta["dtype"], name=names[0], tupleize_cols=False)
    dtypes = meta.get("index_dtypes", [])
    if isinstance(df.index, pd.MultiIndex):
        levels = [level if str(level.dtype) == dtype else level.astype(dtype)
                  for level, dtype in zip(df.index.levels, dtypes, strict=False)]
        df.index = df.index.set_levels(levels)
    elif dtypes and str(df.index.dtype) != dtypes[0]:
        df.index = df.index.astype(dtypes[0])
    if "freq" in meta:
        df.index = pd.DatetimeIndex(df.index, freq=meta["freq"])
    return df


def _owned_arrays(table: pa.Table, sections: Sequence[memoryview]
                  ) -> tuple[pa.Table, dict[int, Any]]:
    """Memory only this result will use, by address: multi-chunk integer and float columns
    joined with NumPy (pyarrow's own pandas conversion does it far more slowly on a cold
    process), and the data buffers Arrow allocated for this read (decompressed, or cast back
    from a packed type) rather than pointing into the entry's ``sections``."""
    import numpy as np

    spans = []
    for section in sections:
        base = pa.py_buffer(section).address
        spans.append((base, base + section.nbytes))
    owned: dict[int, Any] = {}
    columns = []
    for column in table.columns:
        t = column.type
        numeric = pa.types.is_integer(t) or pa.types.is_floating(t)
        if column.num_chunks > 1 and not column.null_count and numeric:
            joined = np.concatenate([chunk.to_numpy() for chunk in column.chunks])
            owned[joined.__array_interface__["data"][0]] = joined
            column = pa.chunked_array([pa.array(joined, type=t)])
        elif column.num_chunks == 1 and not column.null_count and (
                numeric or pa.types.is_temporal(t)) and t.bit_width % 8 == 0:
            chunk = column.chunk(0)
            data = chunk.buffers()[1]
            if data is not None and data.is_mutable and not any(
                    start <= data.address < end for start, end in spans):
                owned[data.address + chunk.offset * t.bit_width // 8] = data
        columns.append(column)
    joined_any = any(not isinstance(v, pa.Buffer) for v in owned.values())
    return (pa.Table.from_arrays(columns, schema=table.schema) if joined_any else table), owned


def _writable_frame(df: Any, sections: Sequence[memoryview], owned: dict[int, Any]) -> Any:
    """Make every column of a frame that Arrow built over ``section`` writable.

    pyarrow hands out read-only NumPy views of its buffers. When the entry is a private
    (copy-on-write) memory map, a writable view of the same pages costs nothing and writes land
    in pages private to this result, never in the file or another hit's result. Memory this
    result ``owned`` is viewed writable as it is; other read-only columns are copied, so a hit
    is an ordinary frame either way.
    """
    import numpy as np
    import pandas as pd

    ranges = []
    for section in sections:
        if not section.readonly:
            base = pa.py_buffer(section).address
            ranges.append((base, base + section.nbytes, section))
    columns = {}
    for position in range(df.shape[1]):
        values = df.iloc[:, position].array
        array = getattr(values, "_ndarray", None)
        if isinstance(values, pd.arrays.NumpyExtensionArray) and array is not None \
                and not array.flags.writeable:
            address = array.__array_interface__["data"][0]
            mine = owned.get(address)
            inside = [(base, section) for base, end, section in ranges
                      if base <= address and address + array.nbytes <= end]
            if isinstance(mine, pa.Buffer) and array.flags.c_contiguous and \
                    address + array.nbytes <= mine.address + mine.size:
                values = np.frombuffer(mine, array.dtype, array.size, address - mine.address)
            elif mine is not None and not isinstance(mine, pa.Buffer) and \
                    mine.dtype == array.dtype and mine.size == array.size:
                values = mine
            elif array.flags.c_contiguous and inside:
                base, section = inside[0]
                values = np.frombuffer(section, array.dtype, array.size, address - base)
            else:
                values = array.copy()
        elif not _writable(values):
            values = values.copy()
        columns[position] = values
    out = pd.DataFrame(columns, index=df.index, copy=False)
    out.columns = df.columns
    return out


def _writable(values: Any) -> bool:
    for name in ("_ndarray", "_codes", "_data"):
        inner = getattr(values, name, None)
        flags = getattr(inner, "flags", None)
        if flags is not None:
            return bool(flags.writeable)
    return True
