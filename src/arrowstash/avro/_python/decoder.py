"""The pure-Python Avro decoder: the fallback where the C extension is not built.

It walks the same plan as the C decoder and fills the same per-node buffers (Arrow layouts), so
``_plan.assemble`` builds identical batches from either, and reports errors as the same
``(code, segment, datum, offset, node, detail)`` tuples.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

import arrowstash.avro.decode_plan as P
from arrowstash import config

__all__ = ["DecodeFailure", "decode_segments"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_UUID = re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class DecodeFailure(Exception):
    """An error tuple on its way to the caller, who adds the segment and datum."""

    def __init__(self, code: int, offset: int, node: int, detail: int = 0) -> None:
        super().__init__(code, offset, node, detail)
        self.code, self.offset, self.node, self.detail = code, offset, node, detail
        self.segment = self.datum = 0


class _Col:
    """The growing buffers of one node; ``valid`` holds one byte per slot until the end."""

    __slots__ = ("data", "length", "nulls", "offsets", "type_ids", "valid")

    def __init__(self, nullable: bool) -> None:
        self.length = 0
        self.nulls = 0
        self.valid: bytearray | None = bytearray() if nullable else None
        self.data = bytearray()
        self.offsets = array("i", [0])
        self.type_ids = bytearray()


Read = Callable[[bytes, int], int]
Empty = Callable[[], None]


def _long(buf: bytes, pos: int, node: int) -> tuple[int, int]:
    start = pos
    value = shift = 0
    end = len(buf)
    for i in range(10):
        if pos >= end:
            raise DecodeFailure(1, start, node)
        b = buf[pos]
        pos += 1
        if i == 9 and b > 1:
            raise DecodeFailure(2, start, node)
        value |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    return (value >> 1) ^ -(value & 1), pos


class _Builder:
    def __init__(self, plan: P.Plan, validate_utf8: bool) -> None:
        self.plan = plan
        self.utf8 = validate_utf8
        # items that take no bytes still allowed: the limit plus the input's size (see
        # config.avro_max_empty_items), so that no input costs more than that
        self.free_limit = config.avro_max_empty_items()
        self.free_left = self.free_limit
        self.cols = [_Col(n.null_branch >= 0) for n in plan.nodes]
        self.readers: list[Read] = []
        self.empties: list[Empty] = []
        for i in range(len(plan.nodes)):
            read, empty = self._compile(i)
            self.readers.append(read)
            self.empties.append(empty)

    # Readers call children through self.readers[i] (looked up at call time, so the order of
    # compilation does not matter).
    def _compile(self, i: int) -> tuple[Read, Empty]:
        node = self.plan.nodes[i]
        col = self.cols[i]
        value_read, value_empty = self._value(i, node, col)
        if node.null_branch < 0:
            return value_read, value_empty
        null_branch = node.null_branch
        valid = col.valid
        assert valid is not None

        def read(buf: bytes, pos: int) -> int:
            start = pos
            index, pos = _long(buf, pos, i)
            if index == null_branch:
                valid.append(0)
                col.nulls += 1
                value_empty()
                return pos
            if index != 1 - null_branch:
                raise DecodeFailure(4, start, i, index)
            valid.append(1)
            return value_read(buf, pos)

        def empty() -> None:
            valid.append(0)
            col.nulls += 1
            value_empty()

        return read, empty

    def _value(self, i: int, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        kind = node.kind
        if kind == P.SKIP:
            nodes = self.plan.nodes
            return (lambda buf, pos: _skip(nodes, i, buf, pos)), (lambda: None)
        if kind == P.RAW:
            return self._raw(i, node, col)
        if kind == P.NULL:
            return self._null(col)
        if kind in (P.INT, P.LONG, P.ENUM):
            return self._varint(i, node, col)
        if kind == P.BOOL:
            return self._bool(i, col)
        if kind in (P.FLOAT, P.DOUBLE, P.FIXED, P.DURATION, P.DEC_FIXED):
            return self._sized(i, node, col)
        if kind in (P.BYTES, P.STRING, P.UUID_STR, P.DEC_BYTES):
            return self._length_prefixed(i, node, col)
        if kind == P.RECORD:
            return self._record(node, col)
        if kind in (P.ARRAY, P.MAP):
            return self._blocks(i, node, col)
        return self._union(i, node, col)

    def _null(self, col: _Col) -> tuple[Read, Empty]:
        def read(buf: bytes, pos: int) -> int:
            col.length += 1
            return pos

        def empty() -> None:
            col.length += 1

        return read, empty

    def _varint(self, i: int, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        kind, data = node.kind, col.data
        width = 8 if kind == P.LONG else 4
        zero = bytes(width)
        limit = node.param

        def read(buf: bytes, pos: int) -> int:
            v, end = _long(buf, pos, i)
            if kind == P.INT and not _INT32_MIN <= v <= _INT32_MAX:
                raise DecodeFailure(3, pos, i, v)
            if kind == P.ENUM and not 0 <= v < limit:
                raise DecodeFailure(9, pos, i, v)
            if kind != P.ENUM and limit and not 0 <= v < limit:  # a time of day
                raise DecodeFailure(19, pos, i, v)
            data.extend(v.to_bytes(width, "little", signed=True))
            col.length += 1
            return end

        def empty() -> None:
            data.extend(zero)
            col.length += 1

        return read, empty

    def _bool(self, i: int, col: _Col) -> tuple[Read, Empty]:
        data = col.data

        def read(buf: bytes, pos: int) -> int:
            if pos >= len(buf):
                raise DecodeFailure(1, pos, i)
            b = buf[pos]
            if b > 1:
                raise DecodeFailure(8, pos, i, b)
            data.append(b)
            col.length += 1
            return pos + 1

        def empty() -> None:
            data.append(0)
            col.length += 1

        return read, empty

    def _sized(self, i: int, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        kind, data = node.kind, col.data
        size = {P.FLOAT: 4, P.DOUBLE: 8, P.DURATION: 12, P.FIXED: node.param,
                P.DEC_FIXED: node.size}[kind]
        zero = bytes({P.DURATION: 16, P.DEC_FIXED: node.param}.get(kind, size))

        def read(buf: bytes, pos: int) -> int:
            end = pos + size
            if end > len(buf):
                raise DecodeFailure(1, pos, i)
            raw = buf[pos:end]
            if kind == P.DURATION:
                months = int.from_bytes(raw[0:4], "little")
                days = int.from_bytes(raw[4:8], "little")
                for part in (months, days):
                    if part > _INT32_MAX:
                        raise DecodeFailure(12, pos, i, part)
                millis = int.from_bytes(raw[8:12], "little")
                raw = raw[0:8] + (millis * 1_000_000).to_bytes(8, "little")
            elif kind == P.DEC_FIXED:
                raw = _decimal(raw, node, pos, i)
            data.extend(raw)
            col.length += 1
            return end

        def empty() -> None:
            data.extend(zero)
            col.length += 1

        return read, empty

    def _length_prefixed(self, i: int, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        kind, data = node.kind, col.data
        offsets = col.offsets
        check_utf8 = kind == P.STRING and self.utf8
        zero = bytes(16 if kind == P.UUID_STR else node.param)

        def read(buf: bytes, pos: int) -> int:
            n, start = _long(buf, pos, i)
            if n < 0:
                raise DecodeFailure(5, pos, i, n)
            end = start + n
            if end > len(buf):
                raise DecodeFailure(1, pos, i)
            raw = buf[start:end]
            if kind == P.UUID_STR:
                if not _UUID.fullmatch(raw):
                    raise DecodeFailure(10, pos, i)
                data.extend(bytes.fromhex(raw.decode().replace("-", "")))
            elif kind == P.DEC_BYTES:
                data.extend(_decimal(raw, node, pos, i))
            else:
                if check_utf8:
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise DecodeFailure(6, pos, i) from None
                data.extend(raw)
                if len(data) > _INT32_MAX:
                    raise DecodeFailure(14, pos, i)
                offsets.append(len(data))
            col.length += 1
            return end

        def empty() -> None:
            if kind in (P.BYTES, P.STRING):
                offsets.append(len(data))
            else:
                data.extend(zero)
            col.length += 1

        return read, empty

    def _raw(self, i: int, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        """A recursive record's value kept as its own encoding: read past, then stored."""
        nodes, data, offsets = self.plan.nodes, col.data, col.offsets
        skip = node.children[0]

        def read(buf: bytes, pos: int) -> int:
            end = _skip(nodes, skip, buf, pos)
            data.extend(buf[pos:end])
            if len(data) > _INT32_MAX:
                raise DecodeFailure(14, pos, i)
            offsets.append(len(data))
            col.length += 1
            return end

        def empty() -> None:
            offsets.append(len(data))
            col.length += 1

        return read, empty

    def _record(self, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        readers, empties = self.readers, self.empties
        children = node.children

        def read(buf: bytes, pos: int) -> int:
            for c in children:
                pos = readers[c](buf, pos)
            col.length += 1
            return pos

        def empty() -> None:
            for c in children:
                empties[c]()
            col.length += 1

        return read, empty

    def _blocks(self, i: int, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        readers = self.readers
        offsets = col.offsets
        children = node.children
        first = self.cols[children[0]]
        item_min = sum(self.plan.nodes[c].min_size for c in children)

        def read(buf: bytes, pos: int) -> int:
            while True:
                start = pos
                count, pos = _long(buf, pos, i)
                if count == 0:
                    break
                if count < 0:
                    count = -count
                    size_start = pos
                    size, pos = _long(buf, pos, i)
                    if size < 0:
                        raise DecodeFailure(5, size_start, i, size)
                if item_min and count * item_min > len(buf) - pos:
                    raise DecodeFailure(13, start, i, count)
                if first.length + count > _INT32_MAX:
                    raise DecodeFailure(14, start, i)
                if not item_min:  # items of no bytes: bounded by the budget, not the input
                    if count > self.free_left:
                        raise DecodeFailure(21, start, i, self.free_limit)
                    self.free_left -= count
                for _ in range(count):
                    for c in children:
                        pos = readers[c](buf, pos)
            offsets.append(first.length)
            col.length += 1
            return pos

        def empty() -> None:
            offsets.append(first.length)
            col.length += 1

        return read, empty

    def _union(self, i: int, node: P.Node, col: _Col) -> tuple[Read, Empty]:
        readers, empties = self.readers, self.empties
        type_ids, offsets = col.type_ids, col.offsets
        del offsets[0]  # a dense union's offsets have one entry per slot
        children = node.children
        branch_cols = [self.cols[c] for c in children]
        nbranches = len(children)
        null_child = next(
            (b for b, c in enumerate(children) if self.plan.nodes[c].kind == P.NULL), 0
        )

        def read(buf: bytes, pos: int) -> int:
            index, end = _long(buf, pos, i)
            if not 0 <= index < nbranches:
                raise DecodeFailure(4, pos, i, index)
            type_ids.append(index)
            offsets.append(branch_cols[index].length)
            col.length += 1
            return readers[children[index]](buf, end)

        def empty() -> None:
            type_ids.append(null_child)
            offsets.append(branch_cols[null_child].length)
            empties[children[null_child]]()
            col.length += 1

        return read, empty

    def columns(self) -> list[tuple[int, int, list[Any]]]:
        out = []
        for node, col in zip(self.plan.nodes, self.cols, strict=True):
            validity = _bitmap(col.valid) if col.valid is not None and col.nulls else None
            kind = node.kind
            bufs: list[Any]
            if kind == P.NULL:
                out.append((col.length, col.length, [None]))
                continue
            if kind == P.BOOL:
                bufs = [validity, _bitmap(col.data)]
            elif kind in (P.BYTES, P.STRING, P.RAW):
                bufs = [validity, col.offsets, col.data]
            elif kind in (P.ARRAY, P.MAP):
                bufs = [validity, col.offsets]
            elif kind == P.RECORD:
                bufs = [validity]
            elif kind == P.UNION:
                bufs = [None, col.type_ids, col.offsets]
            else:
                bufs = [validity, col.data]
            out.append((col.length, col.nulls, bufs))
        return out


def _skip(nodes: Sequence[P.Node], i: int, buf: bytes, pos: int) -> int:
    """Read past one value of SKIP node ``i``; returns the position after it. A loop over a
    stack rather than recursion (recursive data may nest deeper than Python's recursion limit),
    visiting values in the C decoder's order so both report the same first error. Stack items:
    ``(node, depth, -1)`` for a value, ``(node, depth, n)`` for an array or map with ``n`` items
    left in its current block."""
    end = len(buf)
    stack = [(i, 1, -1)]
    while stack:
        i, depth, left = stack.pop()
        node = nodes[i]
        kind = node.param
        if left > 0:  # the next item of an array or map
            stack.append((i, depth, left - 1))
            if kind == P.MAP:
                pos = _skip_bytes(buf, pos, i)
            stack.append((node.children[0], depth + 1, -1))
            continue
        if left == 0:  # an array or map's next block (or its end)
            start = pos
            count, pos = _long(buf, pos, i)
            if count == 0:
                continue
            if count < 0:
                size_start = pos
                size, pos = _long(buf, pos, i)
                if size < 0:
                    raise DecodeFailure(5, size_start, i, size)
                if size > end - pos:
                    raise DecodeFailure(1, size_start, i)
                pos += size
                stack.append((i, depth, 0))
                continue
            item_min = nodes[node.children[0]].min_size + (kind == P.MAP)
            if count * item_min > end - pos:
                raise DecodeFailure(13, start, i, count)
            stack.append((i, depth, count if item_min else 0))
            continue
        if depth > P.SKIP_DEPTH:
            raise DecodeFailure(20, pos, i, P.SKIP_DEPTH)
        if kind in (P.INT, P.LONG, P.ENUM):
            _, pos = _long(buf, pos, i)
        elif kind in (P.BYTES, P.STRING):
            pos = _skip_bytes(buf, pos, i)
        elif kind in (P.BOOL, P.FLOAT, P.DOUBLE, P.FIXED):
            size = 1 if kind == P.BOOL else node.size
            if size > end - pos:
                raise DecodeFailure(1, pos, i)
            pos += size
        elif kind == P.RECORD:
            stack.extend((c, depth + 1, -1) for c in reversed(node.children))
        elif kind in (P.ARRAY, P.MAP):
            stack.append((i, depth, 0))
        elif kind == P.UNION:
            index, after = _long(buf, pos, i)
            if not 0 <= index < len(node.children):
                raise DecodeFailure(4, pos, i, index)
            pos = after
            stack.append((node.children[index], depth + 1, -1))
    return pos


def _skip_bytes(buf: bytes, pos: int, i: int) -> int:
    """Past a length-prefixed value (bytes, string, a map key)."""
    n, start = _long(buf, pos, i)
    if n < 0:
        raise DecodeFailure(5, pos, i, n)
    if n > len(buf) - start:
        raise DecodeFailure(1, pos, i)
    return start + n


def _decimal(raw: bytes, node: P.Node, pos: int, i: int) -> bytes:
    value = int.from_bytes(raw, "big", signed=True) if raw else 0
    if abs(value) >= 10**node.precision:
        raise DecodeFailure(11, pos, i)
    return value.to_bytes(node.param, "little", signed=True)


def _bitmap(flags: bytearray) -> Any:
    """Arrow's bit-packed form of one 0/1 byte per slot."""
    n = len(flags)
    as_bool = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(flags)]).cast(pa.bool_())
    return as_bool.buffers()[1]


def decode_segments(
    plan: P.Plan,
    segments: Sequence[tuple[Any, int]],
    *,
    validate_utf8: bool = True,
    confluent: bool = False,
) -> tuple[list[tuple[int, int, list[Any]]], list[int]]:
    """Decode ``count`` datums from each ``(buffer, count)`` segment; return the per-node
    buffers and, with ``confluent``, each message's schema id. A segment of None is a null
    message. Raises DecodeFailure with ``segment`` and ``datum`` set."""
    builder = _Builder(plan, validate_utf8)
    builder.free_left += sum(memoryview(s).nbytes for s, _ in segments if s is not None)
    read_root = builder.readers[0]
    ids: list[int] = []
    for s, (segment, count) in enumerate(segments):
        datum = 0
        try:
            if segment is None:
                raise DecodeFailure(17, 0, 0)
            buf = bytes(segment)
            pos = 0
            if confluent:
                if len(buf) < 5:
                    raise DecodeFailure(15, 0, 0)
                if buf[0] != 0:
                    raise DecodeFailure(16, 0, 0, buf[0])
                ids.append(int.from_bytes(buf[1:5], "big", signed=True))
                pos = 5
            for datum in range(count):  # noqa: B007 - kept for the error below
                pos = read_root(buf, pos)
            if pos != len(buf):
                raise DecodeFailure(7, pos, 0, len(buf) - pos)
        except DecodeFailure as exc:
            exc.segment, exc.datum = s, datum
            raise
    return builder.columns(), ids
