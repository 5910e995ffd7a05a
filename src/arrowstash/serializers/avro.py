"""Frames and lists of records stored as an Avro Object Container File.

The entry's one section is a complete, standard ``.avro`` file (schema in its header), so a
service in another language can read a cached payload with its own Avro library: see
docs/avro.md for how to get at the section's bytes.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrowstash.entry.format import FLAG_COMPRESSED, Encoded
from arrowstash.errors import ArrowstashError, CorruptEntryError, SerializationError

RETURN_FORMATS = ("auto", "pandas", "polars", "arrow", "records")


@dataclass(frozen=True)
class AvroSerializer:
    """Avro for ``@cache``: pandas or polars frames, Arrow tables or batches, lists of dicts.

    ``schema`` (JSON text, dict or parsed ``Schema``) is the writer schema; by default it is
    derived from the value's Arrow schema (``from_arrow_schema``). ``return_format="auto"``
    gives back the kind stored; "pandas", "polars", "arrow" or "records" (a list of dicts)
    convert. ``codec`` is the container's codec (null, deflate, snappy, zstd, bzip2, xz):
    deflate by default, because every Avro implementation must read it (zstd and snappy are
    optional extras in several, fastavro's zstd among them).
    Avro holds columns only: a pandas index other than the default RangeIndex is refused.
    """

    schema: Any = None
    return_format: str = "auto"
    codec: str | None = "deflate"
    name: str = field(default="avro", init=False)
    executes_code = False
    mutable_results = False  # decoded into new Arrow buffers

    def __post_init__(self) -> None:
        from arrowstash.avro import parse_schema
        from arrowstash.avro.ocf import CODECS, codec_name

        if self.return_format not in RETURN_FORMATS:
            raise ValueError(
                f"return_format must be one of {RETURN_FORMATS}, not {self.return_format!r}"
            )
        try:
            codec_name(self.codec)
        except ValueError:
            raise ValueError(f"codec must be one of {CODECS}, not {self.codec!r}") from None
        if self.schema is not None:
            object.__setattr__(self, "schema", parse_schema(self.schema))

    def for_backend(self, remote: bool) -> AvroSerializer:
        return self  # the container's codec is chosen by ``codec=``, wherever it is stored

    def encode(self, value: Any) -> Encoded:
        from arrowstash.avro import from_arrow_schema
        from arrowstash.avro.ocf import write_ocf

        kind, table = self._table(value)
        meta: dict[str, Any] = {"kind": kind}
        zones = {f.name: f.type.tz for f in table.schema
                 if pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC")}
        if zones:  # Avro instants are UTC: the zone is kept beside the file
            meta["zones"] = zones
        out = io.BytesIO()
        try:
            schema = self.schema or from_arrow_schema(table)
            write_ocf(table, out, schema, self.codec)
        except (ArrowstashError, pa.ArrowException, ValueError, TypeError) as exc:
            raise SerializationError(f"cannot store this {kind} value as Avro: {exc}") from exc
        flags = FLAG_COMPRESSED if self.codec not in (None, "null") else 0
        return Encoded(self.name, meta, [out.getbuffer()], flags)

    def _table(self, value: Any) -> tuple[str, pa.Table]:
        cls = type(value)
        module = cls.__module__.partition(".")[0]
        if isinstance(value, pa.Table):
            return "arrow", value
        if isinstance(value, pa.RecordBatch):
            return "arrow", pa.Table.from_batches([value])
        if module == "pandas" and isinstance(value, sys.modules["pandas"].DataFrame):
            index = value.index
            plain = type(index).__name__ == "RangeIndex" and index.start == 0 and \
                index.step == 1 and index.name is None
            if not plain:
                raise SerializationError(
                    "AvroSerializer stores columns only: this frame has an index "
                    f"({type(index).__name__}); reset_index() first or use ArrowSerializer"
                )
            return "pandas", pa.Table.from_pandas(value, preserve_index=False)
        if module == "polars" and cls.__name__ == "DataFrame":
            return "polars", value.to_arrow()
        if isinstance(value, list) and all(isinstance(row, dict) for row in value):
            target = self.schema.arrow_schema if self.schema is not None else None
            try:
                return "records", pa.Table.from_pylist(value, schema=target)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise SerializationError(f"records do not fit the Avro schema: {exc}") from exc
        raise SerializationError(
            f"AvroSerializer stores pandas or polars frames, Arrow tables and lists of dicts, "
            f"not {cls.__qualname__}"
        )

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any:
        from arrowstash.avro.ocf import read_ocf

        try:
            table = read_ocf(pa.py_buffer(sections[0]))
        except (ArrowstashError, pa.ArrowException, KeyError, IndexError) as exc:
            raise CorruptEntryError(f"unreadable Avro container: {exc}") from exc
        for name, zone in meta.get("zones", {}).items():
            column = table.column(name)
            table = table.set_column(table.schema.get_field_index(name), name,
                                     column.cast(pa.timestamp(column.type.unit, tz=zone)))
        target = meta["kind"] if self.return_format == "auto" else self.return_format
        if target == "arrow":
            return table
        if target == "pandas":
            return table.to_pandas()
        if target == "polars":
            try:
                import polars
            except ImportError:
                raise SerializationError(
                    "polars not installed (pip install 'arrowstash[polars]')"
                ) from None
            return polars.from_arrow(table)
        if target == "records":
            return table.to_pylist(maps_as_pydicts="lossy")
        raise CorruptEntryError(f"unknown kind {target!r} in an Avro entry")
