"""Avro <-> Arrow: schemas, and messages decoded straight into Arrow record batches."""

from arrowstash.avro.schema import (
    Schema,
    canonical_form,
    fingerprint,
    parse_schema,
    to_arrow_schema,
)
from arrowstash.errors import AvroDecodeError, AvroSchemaError

__all__ = [
    "AvroDecodeError",
    "AvroSchemaError",
    "Schema",
    "canonical_form",
    "fingerprint",
    "parse_schema",
    "to_arrow_schema",
]
