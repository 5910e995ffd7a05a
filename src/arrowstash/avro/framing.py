"""Wire headers in front of Avro messages: strip and check them, or add them, for many at once.

Three framings are common on message buses:

- ``"confluent"``: magic byte ``0x00`` + the schema id as a 4-byte big-endian int (Confluent
  Schema Registry serdes);
- ``"apicurio"``: magic byte ``0x00`` + an 8-byte big-endian global id (Apicurio Registry serdes);
- ``"single-object"``: ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
  writer schema's canonical form (the Avro specification's single-object encoding).

Every function works on a whole column of messages with NumPy over the Arrow buffers: no
Python code runs per message. A message whose header is missing or wrong is an
:class:`~arrowstash.AvroDecodeError` naming the message, never decoded as garbage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa

from arrowstash.avro.numpy_import import numpy as np
from arrowstash.errors import AvroDecodeError

__all__ = ["FRAMINGS", "Framing", "Unframed", "add_header", "ids_of", "strip_header"]


@dataclass(frozen=True)
class Framing:
    """One wire header: fixed magic bytes followed by an id of ``id_size`` bytes."""

    name: str
    magic: bytes
    id_size: int
    id_dtype: str  # NumPy dtype of the id as stored on the wire (with its byte order)
    arrow_type: Any  # the id column's Arrow type
    what: str  # the id's name in messages

    @property
    def size(self) -> int:
        return len(self.magic) + self.id_size


FRAMINGS: dict[str, Framing] = {
    f.name: f
    for f in (
        Framing("confluent", b"\x00", 4, ">i4", pa.int32(), "schema id"),
        Framing("apicurio", b"\x00", 8, ">i8", pa.int64(), "global id"),
        Framing("single-object", b"\xc3\x01", 8, "<u8", pa.uint64(), "schema fingerprint"),
    )
}


_HINT = " (are these messages framed at all, or framed differently?)"


class Unframed(NamedTuple):
    """Messages without their headers, and the id each header carried (one per message)."""

    payloads: pa.BinaryArray
    ids: pa.Array


def framing(name: str | Framing) -> Framing:
    if isinstance(name, Framing):
        return name
    try:
        return FRAMINGS[name]
    except KeyError:
        raise ValueError(f"unknown framing {name!r}; choose one of {sorted(FRAMINGS)}") from None


def as_binary(messages: Any) -> pa.Array:
    """A BinaryArray or LargeBinaryArray over ``messages`` (a list of bytes-like, such an
    array, a one-chunk ChunkedArray, or a ``(buffer, offsets)`` pair); arrays are not copied."""
    if isinstance(messages, pa.ChunkedArray):
        messages = messages.combine_chunks()
    if isinstance(messages, pa.Array):
        if messages.type in (pa.binary(), pa.large_binary()):
            return messages
        if messages.type in (pa.string(), pa.large_string()):
            return messages.view(pa.binary() if messages.type == pa.string() else pa.large_binary())
        raise TypeError(f"messages must be a binary array, not {messages.type}")
    if isinstance(messages, tuple) and len(messages) == 2:
        buffer, offsets = messages
        offsets = np.asarray(offsets)
        if offsets.ndim != 1 or offsets.size == 0 or offsets.dtype.kind not in "iu":
            raise TypeError("offsets must be a 1-d integer array of len(messages) + 1")
        data = pa.py_buffer(buffer)
        if offsets[0] < 0 or offsets[-1] > data.size or np.any(np.diff(offsets) < 0):
            raise AvroDecodeError("offsets are not ascending within the buffer")
        kind = pa.large_binary() if offsets[-1] >= 2**31 else pa.binary()
        width = np.int64 if kind == pa.large_binary() else np.int32
        offsets_buffer = pa.py_buffer(np.ascontiguousarray(offsets, dtype=width))
        return pa.Array.from_buffers(kind, offsets.size - 1, [None, offsets_buffer, data])
    if isinstance(messages, (bytes, bytearray, memoryview, str)):
        raise TypeError("messages must be a sequence of messages, not one bytes-like object")
    return pa.array(_as_bytes(messages), type=pa.binary())


def _as_bytes(messages: Iterable[Any]) -> list[Any]:
    return [m if isinstance(m, bytes) else bytes(m) for m in messages]


def offsets_and_data(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The array's offsets (int64, relative to its data buffer) and its data as uint8."""
    width = np.int64 if array.type == pa.large_binary() else np.int32
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=width, count=len(array) + 1, offset=array.offset
                            * np.dtype(width).itemsize).astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else \
        np.zeros(0, np.uint8)
    return offsets, data


def _no_nulls(array: pa.Array) -> None:
    if array.null_count:
        first = int(np.flatnonzero(np.asarray(array.is_null()))[0])
        raise AvroDecodeError(f"message {first} is null, not Avro bytes")


def ids_of(messages: Any, kind: str | Framing) -> pa.Array:
    """Check every message's header and return the ids they carry, without copying payloads.

    A decoder can then read message ``i`` from ``offsets[i] + framing.size``.
    """
    spec = framing(kind)
    array = as_binary(messages)
    _no_nulls(array)
    offsets, data = offsets_and_data(array)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    short = np.flatnonzero(lengths < spec.size)
    if short.size:
        i = int(short[0])
        raise AvroDecodeError(
            f"message {i}: {int(lengths[i])} bytes, shorter than the {spec.size}-byte "
            f"{spec.name} header{_HINT}"
        )
    # Header bytes of every message as an (n, size) matrix gathered from the data buffer.
    header = data[starts[:, None] + np.arange(spec.size)]
    magic = np.frombuffer(spec.magic, np.uint8)
    bad = np.flatnonzero(np.any(header[:, : magic.size] != magic, axis=1))
    if bad.size:
        i = int(bad[0])
        found = bytes(header[i, : magic.size]).hex(" ")
        raise AvroDecodeError(
            f"message {i} at byte 0: expected the {spec.name} header starting "
            f"{spec.magic.hex(' ')}, found {found}{_HINT}"
        )
    ids = np.ascontiguousarray(header[:, magic.size :]).view(spec.id_dtype).ravel()
    return pa.array(ids.astype(ids.dtype.newbyteorder("=")), type=spec.arrow_type)


def strip_header(messages: Any, kind: str | Framing, *,
                 expect: int | Sequence[int] | Any = None) -> Unframed:
    """Check and remove each message's header: the payloads (one compacting copy, at memory
    speed) and the ids. ``expect`` (one id, several, or a parsed ``Schema`` whose fingerprint
    single-object messages must carry) rejects messages carrying another id."""
    spec = framing(kind)
    array = as_binary(messages)
    ids = ids_of(array, spec)
    if hasattr(expect, "fingerprint"):  # a parsed Schema: its CRC-64-AVRO fingerprint
        expect = int.from_bytes(expect.fingerprint, "little")
    if expect is not None:
        allowed = np.asarray([expect] if isinstance(expect, int) else list(expect),
                             dtype=ids.type.to_pandas_dtype())
        wrong = np.flatnonzero(~np.isin(np.asarray(ids), allowed))
        if wrong.size:
            i = int(wrong[0])
            raise AvroDecodeError(
                f"message {i}: {spec.what} {ids[i].as_py()} is not the expected "
                f"{_listing(allowed)}"
            )
    offsets, data = offsets_and_data(array)
    n = len(array)
    keep = np.ones(data.size, dtype=bool)
    keep[: offsets[0]] = False
    keep[offsets[-1] :] = False
    keep[(offsets[:-1, None] + np.arange(spec.size)).ravel()] = False
    payload = data[keep]
    new_offsets = (offsets - offsets[0]) - spec.size * np.arange(n + 1)
    width = np.int64 if array.type == pa.large_binary() else np.int32
    payloads = pa.Array.from_buffers(
        array.type, n, [None, pa.py_buffer(new_offsets.astype(width)), pa.py_buffer(payload)]
    )
    return Unframed(payloads, ids)


def _listing(values: np.ndarray) -> str:
    return str(int(values[0])) if values.size == 1 else "one of " + ", ".join(map(str, values))


def add_header(payloads: Any, kind: str | Framing, ids: int | Sequence[int] | Any) -> pa.Array:
    """Prefix every payload with the header carrying ``ids`` (one for all, or one per message):
    one pass over the bytes, no Python per message."""
    spec = framing(kind)
    array = as_binary(payloads)
    _no_nulls(array)
    offsets, data = offsets_and_data(array)
    n = len(array)
    id_values = np.asarray(ids.to_numpy(zero_copy_only=False) if isinstance(ids, pa.Array)
                           else ids)
    if id_values.ndim == 0:
        id_values = np.full(n, id_values)
    if id_values.shape != (n,):
        raise ValueError(f"{n} payloads but {id_values.size} ids")
    native = np.dtype(spec.id_dtype).newbyteorder("=")
    info = np.iinfo(native)
    if np.any(id_values < info.min) or np.any(id_values > info.max):
        raise ValueError(f"{spec.what}s must fit {native.name} for the {spec.name} header")
    header = np.empty((n, spec.size), np.uint8)
    header[:, : len(spec.magic)] = np.frombuffer(spec.magic, np.uint8)
    header[:, len(spec.magic) :] = (
        id_values.astype(native).astype(spec.id_dtype).view(np.uint8).reshape(n, spec.id_size)
    )
    lengths = offsets[1:] - offsets[:-1]
    new_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths + spec.size, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), np.uint8)
    is_header = np.zeros(out.size, dtype=bool)
    positions = (new_offsets[:-1, None] + np.arange(spec.size)).ravel()
    is_header[positions] = True
    out[positions] = header.ravel()
    out[~is_header] = data[offsets[0] : offsets[-1]]
    large = new_offsets[-1] >= 2**31
    kind_type = pa.large_binary() if large else pa.binary()
    return pa.Array.from_buffers(
        kind_type, n,
        [None, pa.py_buffer(new_offsets.astype(np.int64 if large else np.int32)),
         pa.py_buffer(out)],
    )
