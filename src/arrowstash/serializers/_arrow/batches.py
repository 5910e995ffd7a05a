"""A value seen as Arrow record batches, and the slicing that bounds a batch's size."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrowstash.serializers.standard import StandardSerializer

label_codec = StandardSerializer()  # encodes pandas column labels and names exactly


@dataclass(slots=True)
class Source:
    """A value seen as Arrow: its schema, its batches (made lazily) and how to rebuild it."""

    kind: str
    schema: pa.Schema
    batches: Callable[[], Iterator[pa.RecordBatch]]
    meta: dict[str, Any] = field(default_factory=dict)
    #: The whole value as one table, where converting it costs no copy (else None).
    whole: Callable[[], pa.Table] | None = None


def rows_per_batch(nbytes: int, rows: int, batch_bytes: int) -> int:
    return max(1, int(batch_bytes * rows / nbytes)) if nbytes and rows else max(rows, 1)


def rebatch(
    batches: Iterator[pa.RecordBatch], batch_bytes: int | None
) -> Iterator[pa.RecordBatch]:
    """Slice (without copying) batches much larger than ``batch_bytes``."""
    if batch_bytes is None:
        yield from batches
        return
    for batch in batches:
        step = rows_per_batch(batch.nbytes, batch.num_rows, batch_bytes)
        if batch.num_rows <= step * 1.5:
            yield batch
        else:
            for start in range(0, batch.num_rows, step):
                yield batch.slice(start, step)
