"""The exception tree: one root, so callers can catch everything arrowstash raises."""

from __future__ import annotations


class ArrowstashError(Exception):
    """Root of every error raised by arrowstash itself."""


class SerializationError(ArrowstashError, TypeError):
    """A value cannot be encoded (or decoded) exactly by the chosen serializer.

    It is a ``TypeError`` too, because the usual cause is a value of a type the serializer does
    not support.
    """


class BackendError(ArrowstashError):
    """A cache store failed: I/O error, unreachable server, timeout.

    The client library's own exception is chained as ``__cause__``.
    """


class CorruptEntryError(ArrowstashError):
    """Stored bytes are not a valid entry: truncated, checksum mismatch, foreign or newer format."""


class AvroDecodeError(ArrowstashError, ValueError):
    """Avro bytes do not match their schema."""


class AvroSchemaError(ArrowstashError, ValueError):
    """An Avro schema is invalid or cannot map to Arrow; the message names the type or field."""


class AvroEncodeError(ArrowstashError, ValueError):
    """A value does not fit the Avro schema it is encoded with; names the row and column path."""
