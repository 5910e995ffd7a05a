"""Avro <-> Arrow: schemas, and messages decoded straight into Arrow record batches."""

from typing import Any

from arrowstash.avro.decoder import decode, decode_blocks
from arrowstash.avro.encoder import encode
from arrowstash.avro.from_arrow import from_arrow_schema
from arrowstash.avro.schema import (
    Schema,
    canonical_form,
    fingerprint,
    parse_schema,
    to_arrow_schema,
)
from arrowstash.errors import AvroDecodeError, AvroEncodeError, AvroSchemaError

__all__ = [
    "AvroDecodeError",
    "AvroEncodeError",
    "AvroSchemaError",
    "Schema",
    "Unframed",
    "add_header",
    "canonical_form",
    "decode",
    "decode_blocks",
    "encode",
    "fingerprint",
    "from_arrow_schema",
    "parse_schema",
    "read_ocf",
    "strip_header",
    "to_arrow_schema",
    "write_ocf",
]


def __getattr__(name: str) -> Any:
    # Framing and container files need NumPy (an optional dependency): imported when first used.
    if name in ("Unframed", "add_header", "strip_header"):
        from arrowstash.avro import framing

        return getattr(framing, name)
    if name in ("read_ocf", "write_ocf"):
        from arrowstash.avro import ocf

        return getattr(ocf, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
