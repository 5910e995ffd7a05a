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
from arrowstash.entry.format import FLAG_COMPRESSED, Encoded
from arrowstash.errors import CorruptEntryError, SerializationError
from arrowstash.serializers._arrow.batches import Source, label_codec, rebatch
from arrowstash.serializers._arrow.groups import group_sections, read_groups, size_groups
from arrowstash.serializers._arrow.limits import check_expansion
from arrowstash.serializers._arrow.packing import MIN_TABLE_BYTES
from arrowstash.serializers._arrow.pandas import from_pandas, to_pandas

RETURN_FORMATS = ("auto", "pandas", "polars", "arrow")
COMPRESSIONS = ("zstd", "lz4", None)
_DEFAULT: Any = "default"


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
    executes_code = False
    #: Uncompressed hits view their sections (pandas blocks over a private map may be written).
    mutable_results = True

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

    def for_backend(self, remote: bool) -> ArrowSerializer:
        """This serializer with the default compression resolved: zstd for bytes that cross a
        network, none on a local store (hits are then zero-copy maps)."""
        if self.compression is not _DEFAULT:
            return self
        return replace(self, compression=self._default_codec(remote))

    @staticmethod
    def _default_codec(remote: bool) -> str | None:
        return config.arrow_compression("zstd" if remote else None)

    @property
    def _codec(self) -> str | None:
        return self._default_codec(True) if self.compression is _DEFAULT else self.compression

    # -- encode -----------------------------------------------------------------------------

    def encode(self, value: Any) -> Encoded:
        codec = self._codec
        source = _source(value, self.batch_bytes, split=codec is not None)
        options = self._options(codec)
        meta = {"kind": source.kind, **source.meta}
        flags = FLAG_COMPRESSED if codec else 0
        table = source.whole() if source.whole is not None else None
        if table is not None and codec is None:
            # Columns chunked differently (pandas 3 strings from read_csv or concat, say) would
            # force every column into the same batches, and a hit to join numeric chunks
            # again. Each chunk layout gets its own stream, after one holding the schema.
            groups = _layout_groups(table)
            if len(groups) > 1:
                meta["groups"] = groups
                sections = [_stream(table.schema, list, options)]
                for group in groups:
                    part = table.select(group).replace_schema_metadata(None)
                    sections.append(_stream(part.schema, part.to_batches, options))
                return Encoded(self.name, meta, sections, flags)
        elif table is not None and table.nbytes >= MIN_TABLE_BYTES:
            # compressed: columns packed, in groups compressed by worker threads (_groups)
            groups = size_groups(table, self.batch_bytes)
            meta["groups"], meta["packed"] = groups, True
            codec_ = pa.Codec(codec, self.compression_level)
            sections = group_sections(table, groups, self.batch_bytes, codec_)
            return Encoded(self.name, meta, sections, flags)
        return Encoded(self.name, meta, [_stream(source.schema, source.batches, options)], flags)

    def _options(self, codec: str | None) -> pa.ipc.IpcWriteOptions:
        return pa.ipc.IpcWriteOptions(
            compression=pa.Codec(codec, self.compression_level) if codec else None,
            use_threads=True,
        )

    def serialize(self, value: Any) -> bytes:
        """The value's Arrow IPC stream as bytes (for use outside a cache): one stream, its
        columns in their own types."""
        codec = self._codec
        source = _source(value, self.batch_bytes, split=codec is not None)
        sink = pa.BufferOutputStream()
        _stream(source.schema, source.batches, self._options(codec))(sink)
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
            return to_pandas(table, meta if kind == "pandas" else {}, sections)
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
    for section in sections:  # before the IPC reader allocates what a stream declares
        check_expansion(section, config.max_value_bytes(section.nbytes))
    if "groups" not in meta:
        return pa.ipc.open_stream(pa.py_buffer(sections[0])).read_all()
    schema = pa.ipc.open_stream(pa.py_buffer(sections[0])).schema
    groups = list(zip(meta["groups"], sections[1:], strict=True))
    if meta.get("packed", False):
        columns: list[Any] = [None] * len(schema)
        for group, part in zip(meta["groups"], read_groups(groups, schema, True), strict=True):
            for position, column in zip(group, part, strict=True):
                columns[position] = column
        return pa.Table.from_arrays(columns, schema=schema)
    parts = [pa.ipc.open_stream(pa.py_buffer(section)).read_all() for _, section in groups]
    return _side_by_side(schema, meta["groups"], parts)


def _side_by_side(schema: pa.Schema, groups: list[list[int]], parts: list[pa.Table]
                  ) -> pa.Table:
    """The columns of ``parts`` (holding the columns at ``groups``' positions) as one table of
    ``schema``. Not ``Table.from_arrays``: its validation reads the first and last offset of
    every chunk of a string column, a page fault each in a memory-mapped entry (96 of them on
    flights, most of an "arrow" hit). The IPC reader has checked that every buffer lies inside
    its section, as it has for an entry of one stream."""
    table = parts[0]
    for part in parts[1:]:
        for stored, column in zip(part.schema, part.columns, strict=True):
            table = table.append_column(stored, column)
    positions = [position for group in groups for position in group]
    if sorted(positions) != list(range(len(schema))):
        raise CorruptEntryError(f"column groups {groups} do not cover {len(schema)} columns")
    table = table.select(sorted(range(len(positions)), key=positions.__getitem__))
    if table.schema.names != schema.names:  # (Schema.equals would cost a fifth of the hit)
        raise CorruptEntryError("the column groups do not hold the stored columns")
    return table if schema.metadata is None else table.replace_schema_metadata(schema.metadata)


def _polars() -> Any:
    try:
        import polars
    except ImportError:
        raise SerializationError(
            "polars not installed (pip install 'arrowstash[polars]')"
        ) from None
    return polars


# -- values to Arrow --------------------------------------------------------------------------


def _source(value: Any, batch_bytes: int, split: bool) -> Source:
    cls = type(value)
    module = cls.__module__.partition(".")[0]
    if module == "pandas" and isinstance(value, sys.modules["pandas"].DataFrame):
        return from_pandas(value, batch_bytes, split)
    limit = batch_bytes if split else None
    if isinstance(value, pa.Table):
        return _table_source("arrow", value, limit)
    if isinstance(value, pa.RecordBatch):
        return Source("batch", value.schema, lambda: iter([value]))
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




def _table_source(kind: str, table: pa.Table, batch_bytes: int | None) -> Source:
    return Source(kind, table.schema, lambda: rebatch(iter(table.to_batches()), batch_bytes),
                   whole=lambda: table)


def _stream_source(kind: str, value: Any, batch_bytes: int | None) -> Source:
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
        return rebatch(iter(reader), batch_bytes)

    return Source(kind, reader.schema, batches)


_ACCEPTED = "a list, tuple, NumPy array, pandas Series, pyarrow array or typed memoryview"


def _from_columns(columns: dict[Any, Any], batch_bytes: int | None) -> Source:
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
        name: [str(column.dtype), label_codec.pack(getattr(column, "name", None))]
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
            out[name] = column.to_pandas().astype(dtype).rename(label_codec.unpack(label))
        elif kind == "pandas-array":
            out[name] = column.to_pandas().astype(series[name][0]).array
        elif kind == "memoryview":
            out[name] = memoryview(column.to_numpy())
        elif kind == "array":
            out[name] = column.combine_chunks()
        else:
            out[name] = column
    return out


