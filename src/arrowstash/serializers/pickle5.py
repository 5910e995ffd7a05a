"""Any picklable object through pickle protocol 5, its large buffers out-of-band (PEP 574).

The pickle stream stays small; every large contiguous buffer the object exposes (NumPy and Arrow
memory, any ``PickleBuffer``) becomes a section of the entry, written straight from
the object's memory and handed back to ``pickle.loads`` as a view of the stored bytes.

Unpickling runs code: entries written here are signed (HMAC-SHA256, see
:mod:`arrowstash.entry.format`) when a secret is configured, and the decorator refuses to read them
unsigned from a shared store.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from arrowstash.entry.format import Encoded
from arrowstash.errors import CorruptEntryError, SerializationError


class BufferSerializer:
    """Pickle protocol 5 with out-of-band buffers of ``inband_below`` bytes or more."""

    name = "buffers"
    #: Decoding runs the pickled object's code: the decorator applies its signing rules.
    executes_code = True
    #: Loaded arrays view their sections: callers may write to them.
    mutable_results = True

    def for_backend(self, remote: bool) -> BufferSerializer:
        return self

    def __init__(self, inband_below: int = 4096) -> None:
        self.inband_below = inband_below

    def encode(self, value: Any) -> Encoded:
        sections: list[Any] = [b""]

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            try:
                raw = buffer.raw()
            except BufferError:  # not contiguous: pickle copies it in-band
                return True
            if raw.nbytes < self.inband_below:
                return True
            sections.append(raw)
            return False

        try:
            sections[0] = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
        except (pickle.PicklingError, TypeError, AttributeError, ValueError,
                RecursionError) as exc:
            raise SerializationError(
                f"value of type {type(value).__qualname__} cannot be pickled: {exc}"
            ) from exc
        return Encoded(self.name, None, sections)

    def decode(self, meta: Any, sections: Sequence[memoryview]) -> Any:
        try:
            return pickle.loads(sections[0], buffers=sections[1:])
        except (pickle.UnpicklingError, EOFError, ValueError, IndexError, ImportError,
                AttributeError, TypeError, RecursionError, MemoryError) as exc:
            # also: the pickled class no longer exists, or no longer takes what was pickled;
            # MemoryError: a damaged length asked for more memory than the machine has
            raise CorruptEntryError(f"unreadable pickle: {exc}") from exc
