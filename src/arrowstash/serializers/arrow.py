"""Frames (pandas, polars, Arrow, dicts of columns) as one Arrow IPC stream section.

The stream is written record batch by record batch into the entry's destination, so storing a
frame never holds a second copy of it. Reading an uncompressed entry from a memory map is
zero-copy: the returned Arrow buffers point into the map.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from arrowstash import config
from arrowstash.entry import FLAG_COMPRESSED, Encoded
from arrowstash.errors import CorruptEntryError, SerializationError
from arrowstash.serializers.standard import StandardSerializer

RETURN_FORMATS = ("auto", "pandas", "polars", "arrow")
COMPRESSIONS = ("zstd", "lz4", None)
_DEFAULT: Any = "default"
_labels = StandardSerializer()  # encodes pandas column labels and names exactly


@dataclass(slots=True)
class _Source:
    """A value seen as Arrow: its schema, its batches (made lazily) and how to rebuild it."""

    kind: str
    schema: pa.Schema
    batches: Callable[[], Iterator[pa.RecordBatch]]
    meta: dict[str, Any] = field(default_factory=dict)
    #: The whole value as one table, where converting it costs no copy (else None).
    whole: Callable[[], pa.Table] | None = None


@dataclass(frozen=True)
class ArrowSerializer:
    """Arrow IPC for frames.

    ``return_format="auto"`` gives back the type that was stored; "pandas", "polars" or "arrow"
    convert. ``compression`` is "zstd", "lz4" or None; by default the backend chooses (None on
    the local File backend, for zero-copy hits) unless ``ARROWSTASH_ARROW_COMPRESSION`` is set.
    Batches of about ``batch_bytes`` bound the memory a store needs beyond the frame itself
    where a copy is made anyway (compression, conversion of object columns); otherwise columns
    are written whole, so that an uncompressed hit is one chunk per column and converts to
    pandas or polars without concatenating.
    """

    return_format: str = "auto"
    compression: str | None = _DEFAULT
    compression_level: int | None = None
    batch_bytes: int = 8 << 20
    name: str = field(default="arrow", init=False)

    def __post_init__(self) -> None:
        if self.return_format not in RETURN_FORMATS:
            raise ValueError(
                f"return_format must be one of {RETURN_FORMATS}, not {self.return_format!r}"
            )
        if self.compression is not _DEFAULT and self.compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be one of {COMPRESSIONS}, not {self.compression!r}"
            )
        if self.batch_bytes < 1:
            raise ValueError(f"batch_bytes must be positive, not {self.batch_bytes!r}")

    def for_backend(self, backend: Any) -> ArrowSerializer:
        """This serializer with the default compression resolved for ``backend``."""
        if self.compression is not _DEFAULT:
            return self
        return replace(self, compression=self._default_codec(backend))

    @staticmethod
    def _default_codec(backend: Any) -> str | None:
        return config.arrow_compression(getattr(backend, "arrow_compression", "zstd"))

    @property
    def _codec(self) -> str | None:
        return self._default_codec(None) if self.compression is _DEFAULT else self.compression

    # -- encode -----------------------------------------------------------------------------

    def encode(self, value: Any) -> Encoded:
        codec = self._codec
        source = _source(value, self.batch_bytes, split=codec is not None)
        options = pa.ipc.IpcWriteOptions(
            compression=pa.Codec(codec, self.compression_level) if codec else None,
            use_threads=True,
        )
        meta = {"kind": source.kind, **source.meta}
        flags = FLAG_COMPRESSED if codec else 0
        if codec is None and source.whole is not None:
            table = source.whole()
            groups = _layout_groups(table)
            if len(groups) > 1:
                # Columns chunked differently (pandas 3 strings from read_csv or concat, say)
                # would force every column into the same batches, and a hit to join numeric
                # chunks again. Each chunk layout gets its own stream instead, after a stream
                # holding only the full schema.
                meta["groups"] = groups
                sections = [_stream(table.schema, list, options)]
                for group in groups:
                    part = table.select(group).replace_schema_metadata(None)
                    sections.append(_stream(part.schema, part.to_batches, options))
                return Encoded(self.name, meta, sections, flags)
        return Encoded(self.name, meta, [_stream(source.schema, source.batches, options)], flags)

    def serialize(self, value: Any) -> bytes:
        """The value's Arrow IPC stream as bytes (for use outside a cache)."""
        sink = pa.BufferOutputStream()
        self.encode(value).sections[0](sink)
        return bytes(sink.getvalue())

    # -- decode -----------------------------------------------------------------------------

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any:
        try:
            table = _read_table(meta, sections)
        except (pa.ArrowException, OSError, IndexError) as exc:
            raise CorruptEntryError(f"unreadable Arrow IPC stream: {exc}") from exc
        kind = meta["kind"]
        target = kind if self.return_format == "auto" else self.return_format
        try:
            return self._convert(table, target, kind, meta, sections)
        except (pa.ArrowException, TypeError, ValueError, KeyError) as exc:
            raise CorruptEntryError(f"cannot rebuild the stored {kind} value: {exc}") from exc

    def _convert(self, table: pa.Table, target: str, kind: str, meta: dict[str, Any],
                 sections: Sequence[memoryview]) -> Any:
        if target in ("arrow", "stream"):
            return table
        if target == "batch":
            batches = table.to_batches()
            if len(batches) == 1:
                return batches[0]
            return table.combine_chunks().to_batches()[0] if table.num_rows else \
                pa.RecordBatch.from_pylist([], schema=table.schema)
        if target in ("polars", "polars-lazy"):
            frame = _polars().from_arrow(table, rechunk=False)
            return frame.lazy() if target == "polars-lazy" else frame
        if target == "pandas":
            return _to_pandas(table, meta if kind == "pandas" else {}, sections)
        if target == "columns":
            return _to_columns(table, meta["columns"], meta.get("series", {}))
        raise CorruptEntryError(f"unknown frame kind {kind!r} in entry")


def _stream(
    schema: pa.Schema, batches: Callable[[], Any], options: pa.ipc.IpcWriteOptions
) -> Callable[[Any], None]:
    """A section writer: the IPC stream of ``batches()``, written as they come."""

    def write(sink: Any) -> None:
        with pa.ipc.new_stream(sink, schema, options=options) as writer:
            for batch in batches():
                writer.write_batch(batch)

    return write


def _layout_groups(table: pa.Table) -> list[list[int]]:
    """Column positions grouped by chunk layout."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for position, column in enumerate(table.columns):
        groups.setdefault(tuple(len(chunk) for chunk in column.chunks), []).append(position)
    return list(groups.values())


def _read_table(meta: dict[str, Any], sections: Sequence[memoryview]) -> pa.Table:
    if "groups" not in meta:
        return pa.ipc.open_stream(pa.py_buffer(sections[0])).read_all()
    schema = pa.ipc.open_stream(pa.py_buffer(sections[0])).schema
    columns: list[Any] = [None] * len(schema)
    for group, section in zip(meta["groups"], sections[1:], strict=True):
        part = pa.ipc.open_stream(pa.py_buffer(section)).read_all()
        for j, position in enumerate(group):
            columns[position] = part.column(j)
    return pa.Table.from_arrays(columns, schema=schema)


def _polars() -> Any:
    try:
        import polars
    except ImportError:
        raise SerializationError(
            "polars not installed (pip install 'arrowstash[polars]')"
        ) from None
    return polars


# -- values to Arrow --------------------------------------------------------------------------


def _source(value: Any, batch_bytes: int, split: bool) -> _Source:
    cls = type(value)
    module = cls.__module__.partition(".")[0]
    if module == "pandas" and isinstance(value, sys.modules["pandas"].DataFrame):
        return _from_pandas(value, batch_bytes, split)
    limit = batch_bytes if split else None
    if isinstance(value, pa.Table):
        return _table_source("arrow", value, limit)
    if isinstance(value, pa.RecordBatch):
        return _Source("batch", value.schema, lambda: iter([value]))
    if isinstance(value, dict):
        return _from_columns(value, limit)
    if module == "polars" and cls.__name__ == "LazyFrame":
        return replace(_stream_source("polars", value.collect(), limit), kind="polars-lazy")
    if module == "polars" and cls.__name__ == "DataFrame":
        return _stream_source("polars", value, limit)
    if hasattr(value, "__arrow_c_stream__"):
        return _stream_source("stream", value, limit)
    raise SerializationError(
        f"ArrowSerializer stores frames (pandas, polars, Arrow tables, dicts of columns), "
        f"not {cls.__module__}.{cls.__qualname__}"
    )


def _rows_per_batch(nbytes: int, rows: int, batch_bytes: int) -> int:
    return max(1, int(batch_bytes * rows / nbytes)) if nbytes and rows else max(rows, 1)


def _rebatch(
    batches: Iterator[pa.RecordBatch], batch_bytes: int | None
) -> Iterator[pa.RecordBatch]:
    """Slice (without copying) batches much larger than ``batch_bytes``."""
    if batch_bytes is None:
        yield from batches
        return
    for batch in batches:
        step = _rows_per_batch(batch.nbytes, batch.num_rows, batch_bytes)
        if batch.num_rows <= step * 1.5:
            yield batch
        else:
            for start in range(0, batch.num_rows, step):
                yield batch.slice(start, step)


def _table_source(kind: str, table: pa.Table, batch_bytes: int | None) -> _Source:
    return _Source(kind, table.schema, lambda: _rebatch(iter(table.to_batches()), batch_bytes),
                   whole=lambda: table)


def _stream_source(kind: str, value: Any, batch_bytes: int | None) -> _Source:
    try:
        reader = pa.RecordBatchReader.from_stream(value)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise SerializationError(
            f"{type(value).__qualname__} does not export a table-like Arrow stream: {exc}"
        ) from exc
    used = False

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal used
        if used:  # a stream can be read once; a retry must not silently write nothing
            raise SerializationError("this Arrow stream was already consumed")
        used = True
        return _rebatch(iter(reader), batch_bytes)

    return _Source(kind, reader.schema, batches)


_ACCEPTED = "a list, tuple, NumPy array, pandas Series, pyarrow array or typed memoryview"


def _from_columns(columns: dict[Any, Any], batch_bytes: int | None) -> _Source:
    arrays, kinds = [], []
    for name, column in columns.items():
        if not isinstance(name, str):
            raise SerializationError(f"column names must be str, not {type(name).__qualname__}")
        kind, array = _column(name, column)
        arrays.append(array)
        kinds.append(kind)
    lengths = {len(a) for a in arrays}
    if len(lengths) > 1:
        raise SerializationError(f"columns have different lengths: {sorted(lengths)}")
    table = pa.Table.from_arrays(arrays, names=list(columns))
    source = _table_source("columns", table, batch_bytes)
    source.meta["columns"] = kinds
    # pandas values come back with their dtype, a Series with its name too (not its index:
    # the columns of a dict share their row positions)
    source.meta["series"] = {
        name: [str(column.dtype), _labels.pack(getattr(column, "name", None))]
        for (name, column), kind in zip(columns.items(), kinds, strict=True)
        if kind in ("pandas", "pandas-array")
    }
    return source


def _column(name: str, column: Any) -> tuple[str, Any]:
    cls = type(column)
    module = cls.__module__.partition(".")[0]
    try:
        if cls is list or cls is tuple:
            return cls.__name__, pa.array(column)
        if isinstance(column, pa.Array):
            return "array", column
        if isinstance(column, pa.ChunkedArray):
            return "arrow", column
        if module == "numpy" and cls.__name__ == "ndarray":
            if column.ndim != 1:
                raise SerializationError(f"value for {name!r} is a {column.ndim}-D array, not 1-D")
            return "numpy", pa.array(column)
        if module == "pandas" and cls.__name__ == "Series":
            return "pandas", pa.Array.from_pandas(column)
        if cls is memoryview:
            import numpy as np

            return "memoryview", pa.array(np.asarray(column).ravel())
        if module == "pandas" and hasattr(column, "__arrow_array__"):
            return "pandas-array", pa.array(column)
        if hasattr(column, "__arrow_array__") or hasattr(column, "__arrow_c_array__"):
            return "arrow", pa.array(column)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        if isinstance(exc, SerializationError):
            raise
        raise SerializationError(f"value for {name!r} cannot be stored as a column: {exc}") from exc
    raise SerializationError(f"value for {name!r} is {cls.__qualname__}, not {_ACCEPTED}")


def _to_columns(table: pa.Table, kinds: list[str], series: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, column, kind in zip(table.column_names, table.columns, kinds, strict=True):
        if kind == "list":
            out[name] = column.to_pylist()
        elif kind == "tuple":
            out[name] = tuple(column.to_pylist())
        elif kind == "numpy":
            out[name] = column.to_numpy()
        elif kind == "pandas":
            dtype, label = series[name]
            out[name] = column.to_pandas().astype(dtype).rename(_labels.unpack(label))
        elif kind == "pandas-array":
            out[name] = column.to_pandas().astype(series[name][0]).array
        elif kind == "memoryview":
            out[name] = memoryview(column.to_numpy())
        elif kind == "array":
            out[name] = column.combine_chunks()
        else:
            out[name] = column
    return out


# -- pandas -----------------------------------------------------------------------------------


def _from_pandas(df: Any, batch_bytes: int, split: bool) -> _Source:
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
            yield from _rebatch(iter(batches_of(renamed)), batch_bytes if split else None)
            return
        # object columns are copied by the conversion: a slice at a time bounds that copy
        nbytes = int(df.memory_usage(index=True, deep=False).sum())
        step = _rows_per_batch(nbytes, len(df), batch_bytes)
        for start in range(0, max(len(renamed), 1), step):
            yield from batches_of(renamed.iloc[start : start + step])

    whole = (lambda: convert(renamed)) if not object_columns and len(df) else None
    return _Source("pandas", schema, batches, meta, whole)


def _pandas_meta(df: Any, object_columns: list[int], renamed: bool) -> dict[str, Any]:
    """What Arrow's own pandas metadata does not restore exactly: column labels (any hashable,
    MultiIndex, categorical), object dtypes, the dtypes of index levels (object, nullable with
    NA), the index's freq, and the length of a frame without columns."""
    import pandas as pd

    columns, index = df.columns, df.index
    meta: dict[str, Any] = {
        "labels": _labels.pack(list(columns)),
        "names": _labels.pack(list(columns.names)),
        "multi": isinstance(columns, pd.MultiIndex),
        "dtype": None if isinstance(columns, pd.MultiIndex) else str(columns.dtype),
        "renamed": renamed,
        "objects": object_columns,
    }
    if isinstance(columns, pd.CategoricalIndex):
        meta["categories"] = _labels.pack(list(columns.categories))
        meta["ordered"] = bool(columns.ordered)
    meta["index_dtypes"] = [str(index.get_level_values(i).dtype) for i in range(index.nlevels)]
    if isinstance(index, pd.DatetimeIndex) and index.freq is not None:
        meta["freq"] = index.freqstr
    if df.shape[1] == 0 and isinstance(index, pd.RangeIndex):
        meta["range"] = [index.start, index.stop, index.step, _labels.pack(index.name)]
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
    back = _to_pandas(pa.Table.from_pandas(head, schema=schema, preserve_index=None), meta, [])
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


def _to_pandas(table: pa.Table, meta: dict[str, Any], sections: Sequence[memoryview]) -> Any:
    table, owned = _join_numeric_chunks(table)
    df = _writable_frame(table.to_pandas(split_blocks=True), sections, owned)
    return _restore_pandas(df, meta) if meta else df


def _restore_pandas(df: Any, meta: dict[str, Any]) -> Any:
    """Undo what Arrow's pandas metadata cannot: see :func:`_pandas_meta`."""
    import pandas as pd

    if "range" in meta and df.shape[1] == 0:
        start, stop, step, name = meta["range"]
        df = pd.DataFrame(index=pd.RangeIndex(start, stop, step, name=_labels.unpack(name)))
    for position in meta["objects"]:
        df.isetitem(position, df.iloc[:, position].astype(object))
    labels = _labels.unpack(meta["labels"])
    names = _labels.unpack(meta["names"])
    if meta["multi"]:
        df.columns = pd.MultiIndex.from_tuples(labels, names=names)
    elif "categories" in meta:
        df.columns = pd.CategoricalIndex(
            labels, categories=_labels.unpack(meta["categories"]), ordered=meta["ordered"],
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


def _join_numeric_chunks(table: pa.Table) -> tuple[pa.Table, dict[int, Any]]:
    """Concatenate multi-chunk integer and float columns with NumPy (pyarrow's own pandas
    conversion does it far more slowly on a cold process) into arrays this result owns."""
    import numpy as np

    owned: dict[int, Any] = {}
    columns = []
    for column in table.columns:
        t = column.type
        if column.num_chunks > 1 and not column.null_count and \
                (pa.types.is_integer(t) or pa.types.is_floating(t)):
            joined = np.concatenate([chunk.to_numpy() for chunk in column.chunks])
            owned[joined.__array_interface__["data"][0]] = joined
            column = pa.chunked_array([pa.array(joined, type=t)])
        columns.append(column)
    return (pa.Table.from_arrays(columns, schema=table.schema) if owned else table), owned


def _writable_frame(df: Any, sections: Sequence[memoryview], owned: dict[int, Any]) -> Any:
    """Make every column of a frame that Arrow built over ``section`` writable.

    pyarrow hands out read-only NumPy views of its buffers. When the entry is a private
    (copy-on-write) memory map, a writable view of the same pages costs nothing and writes land
    in pages private to this result, never in the file or another hit's result. Arrays this
    result already ``owned`` are used as they are; other read-only columns are copied, so a hit
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
            if mine is not None and mine.dtype == array.dtype and mine.size == array.size:
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
