"""Pure-Python Avro encoder: the fallback twin of ``_cencode``, byte for byte the same.

It walks the same plan over the same normalised arrays (see encode_plan.py), one row at a time,
through closures bound once per array. It also words every value error: when the native encoder
stops at a row, encoder.py re-encodes that one row here to describe what was wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from arrowstash.avro.encode_nodes import (
    K_ARRAY,
    K_BINARY,
    K_BOOL,
    K_DECIMAL_BYTES,
    K_DECIMAL_FIXED,
    K_DOUBLE,
    K_DURATION,
    K_ENUM,
    K_ENUM_STRING,
    K_FIXED,
    K_FLOAT,
    K_INT32,
    K_INT64,
    K_INT64_AS_INT,
    K_LARGE_BINARY,
    K_MAP,
    K_NULL,
    K_RAW,
    K_RECORD,
    K_UNION,
    K_UUID_STRING,
    Node,
)
from arrowstash.avro.schema import describe

Writer = Callable[[int, bytearray], object]

_INT32 = (-(2**31), 2**31 - 1)


class Fault(Exception):
    """A value that does not fit the schema; ``row`` is filled in by the row loop."""

    def __init__(self, node: Node, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.message = message
        self.row = -1


def long_bytes(v: int) -> bytes:
    """Zigzag varint of a long."""
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_rows(root: Node, arrays: Sequence[Any]) -> tuple[bytes, list[int]]:
    """Encode every row of ``arrays`` (normalised top-level arrays, in order): the datums back
    to back and the offsets (one more than rows). Raises Fault at the first bad value."""
    out = bytearray()
    offsets = [0]
    row = 0
    for arr in arrays:
        write = _bind(root, arr)
        for i in range(len(arr)):
            try:
                write(i, out)
            except Fault as fault:
                fault.row = row
                raise
            offsets.append(len(out))
            row += 1
    return bytes(out), offsets


def _bind(n: Node, arr: Any) -> Writer:
    """A writer of element i (in arr's logical coordinates) with its union prefix and nulls."""
    value = _bind_value(n, arr)
    nulls = n.kind != K_NULL and arr.null_count > 0
    valid = arr.is_valid().to_pylist() if nulls else None
    prefix = long_bytes(n.value_branch) if n.value_branch >= 0 else b""
    null_bytes = long_bytes(n.null_branch) if n.null_branch >= 0 else None

    def write(i: int, out: bytearray) -> None:
        if valid is not None and not valid[i]:
            if null_bytes is None:
                raise Fault(n, f"null in a non-nullable field of Avro type {describe(n.avro)}")
            out += null_bytes
            return
        out += prefix
        value(i, out)

    return write


def _raw(arr: Any, width: int) -> Callable[[int], bytes]:
    """Element i's bytes of a fixed-width array (read from its buffer, offset applied)."""
    buf = memoryview(arr.buffers()[1] or b"")
    base = arr.offset * width

    def at(i: int) -> bytes:
        start = base + i * width
        return bytes(buf[start : start + width])

    return at


def _bind_value(n: Node, arr: Any) -> Writer:
    kind = n.kind
    if kind == K_NULL:
        return lambda i, out: None
    if kind == K_BOOL:
        bools = arr.to_pylist()
        return lambda i, out: out.append(1 if bools[i] else 0)
    if kind in (K_INT32, K_INT64, K_INT64_AS_INT, K_ENUM):
        return _ints(n, arr)
    if kind in (K_FLOAT, K_DOUBLE):
        raw = _raw(arr, 4 if kind == K_FLOAT else 8)
        return lambda i, out: out.__iadd__(raw(i))
    if kind in (K_BINARY, K_LARGE_BINARY, K_ENUM_STRING):
        return _blobs(n, arr)
    if kind == K_RAW:  # a whole encoding, checked when normalised
        encoded = arr.to_pylist()
        return lambda i, out: out.__iadd__(encoded[i])
    if kind == K_FIXED:
        raw = _raw(arr, n.p1)
        return lambda i, out: out.__iadd__(raw(i))
    if kind == K_UUID_STRING:
        return _uuid_text(_raw(arr, 16))
    if kind in (K_DECIMAL_BYTES, K_DECIMAL_FIXED):
        return _decimal(n, _raw(arr, n.p2))
    if kind == K_DURATION:
        return _duration(n, _raw(arr, 16))
    if kind == K_RECORD:
        return _record(n, arr)
    if kind in (K_ARRAY, K_MAP):
        return _block(n, arr)
    assert kind == K_UNION
    return _union(n, arr)


def _ints(n: Node, arr: Any) -> Writer:
    kind = n.kind
    ints = arr.view(pa.int32() if kind in (K_INT32, K_ENUM) else pa.int64()).to_pylist()
    if kind in (K_INT32, K_INT64):
        return lambda i, out: out.__iadd__(long_bytes(ints[i]))
    lo, hi = (0, n.p1 - 1) if kind == K_ENUM else _INT32

    def checked(i: int, out: bytearray) -> None:
        v = ints[i]
        if not lo <= v <= hi:
            if kind == K_ENUM:
                raise Fault(n, f"enum index {v} out of range for {describe(n.avro)}")
            raise Fault(n, f"{v} is out of the range of Avro int")
        out += long_bytes(v)

    return checked


def _blobs(n: Node, arr: Any) -> Writer:
    """Strings and bytes, and enums given as their symbols' text."""
    kind = n.kind
    blobs = arr.view(pa.large_binary() if kind == K_LARGE_BINARY else pa.binary()).to_pylist()
    if kind != K_ENUM_STRING:
        return lambda i, out: out.__iadd__(long_bytes(len(blobs[i])) + blobs[i])
    where = {s.encode(): k for k, s in enumerate(n.symbols)}

    def symbol(i: int, out: bytearray) -> None:
        k = where.get(blobs[i])
        if k is None:
            text = blobs[i].decode(errors="replace")
            raise Fault(n, f"{text!r} is not a symbol of enum {describe(n.avro)} "
                        f"{list(n.symbols)}")
        out += long_bytes(k)

    return symbol


def _uuid_text(raw: Callable[[int], bytes]) -> Writer:
    def uuid_text(i: int, out: bytearray) -> None:
        h = raw(i).hex()
        out += b"\x48" + f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}".encode()

    return uuid_text


def _record(n: Node, arr: Any) -> Writer:
    kids = [_bind(k, arr.field(j)) for j, k in enumerate(n.kids)]

    def record(i: int, out: bytearray) -> None:
        for kid in kids:
            kid(i, out)

    return record


def _block(n: Node, arr: Any) -> Writer:
    """An array's or a map's items of one row, as one block and the end marker."""
    offsets = arr.offsets.to_pylist()
    children = [arr.values] if n.kind == K_ARRAY else [arr.keys, arr.items]
    kids = [_bind(k, c) for k, c in zip(n.kids, children, strict=True)]

    def block(i: int, out: bytearray) -> None:
        start, stop = offsets[i], offsets[i + 1]
        if stop > start:
            out += long_bytes(stop - start)
            for j in range(start, stop):
                for kid in kids:
                    kid(j, out)
        out.append(0)

    return block


def _union(n: Node, arr: Any) -> Writer:
    # read from the buffers: pyarrow's type_codes and offsets ignore a slice's offset
    own = arr.buffers()
    start, stop = arr.offset, arr.offset + len(arr)
    codes = memoryview(own[1]).cast("b")[start:stop].tolist()
    sparse = bool(n.p1)
    offsets = None if sparse else memoryview(own[2]).cast("i")[start:stop].tolist()
    kids = [_bind(k, arr.field(j)) for j, k in enumerate(n.kids)]

    def union(i: int, out: bytearray) -> None:
        t = codes[i]
        if not 0 <= t < len(kids):
            raise Fault(n, f"union type code {t} out of range for {describe(n.avro)}")
        out += long_bytes(t)
        kids[t](i if offsets is None else offsets[i], out)

    return union


def _decimal(n: Node, raw: Callable[[int], bytes]) -> Writer:
    fixed = n.kind == K_DECIMAL_FIXED

    def decimal(i: int, out: bytearray) -> None:
        v = int.from_bytes(raw(i), "little", signed=True)
        if not fixed:
            # minimal two's complement, as Java's BigInteger.toByteArray writes it
            size = (v if v >= 0 else ~v).bit_length() // 8 + 1
            out += long_bytes(size) + v.to_bytes(size, "big", signed=True)
            return
        try:
            out += v.to_bytes(n.p1, "big", signed=True)
        except OverflowError:
            raise Fault(n, f"decimal unscaled value {v} does not fit the {n.p1} bytes of "
                        f"{describe(n.avro)}") from None

    return decimal


_DURATION = struct.Struct("<iiq")
_MAX_MILLIS = 2**32 - 1


def _duration(n: Node, raw: Callable[[int], bytes]) -> Writer:
    def duration(i: int, out: bytearray) -> None:
        months, days, nanos = _DURATION.unpack(raw(i))
        if months < 0 or days < 0 or nanos < 0 or nanos % 1_000_000 or nanos > _MAX_MILLIS * 10**6:
            raise Fault(n, f"duration ({months} months, {days} days, {nanos} ns) has no Avro form "
                        "(unsigned 32-bit months, days and whole milliseconds)")
        out += struct.pack("<III", months, days, nanos // 1_000_000)

    return duration
