"""The entry format: round trips, alignment, and that no damaged entry ever parses to other data."""

from __future__ import annotations

import io
import struct
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowstash.entry.format import (
    ALIGN,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    Encoded,
    Key,
    entry_bytes,
    parse_entry,
    read_header,
    write_entry,
)
from arrowstash.errors import CorruptEntryError

KEY = Key("ns", "mod.fn", bytes(range(16)))
CREATED = 1_700_000_000.25
EXPIRES = 1_700_000_600.5
VERSION_AT = 8  # after the 8-byte magic
CHECKSUM_AT = 48


def _encoded(*sections: Any, meta: Any = None) -> Encoded:
    return Encoded("standard", {"m": 1} if meta is None else meta, list(sections))


def _small_entry() -> tuple[bytearray, list[bytes]]:
    sections = [b"hello", b"", b"world!" * 15, bytes(range(7))]
    buf = entry_bytes(KEY, _encoded(*sections), created=CREATED, expires=EXPIRES)
    return buf, sections


def _section_table(buf: Any) -> list[list[int]]:
    """The (offset, length, digest) rows of the trailer, read independently of parse_entry."""
    header = read_header(buf)
    trailer = msgpack.unpackb(bytes(buf[header.trailer_at :]), raw=False)
    return trailer["sec"]


def _protected_ranges(buf: Any) -> list[range]:
    """Byte ranges covered by a checksum: header, sections, trailer (not the padding)."""
    header = read_header(buf)
    ranges = [range(0, ALIGN), range(header.trailer_at, header.total)]
    ranges += [range(offset, offset + length) for offset, length, _ in _section_table(buf)]
    return ranges


def _rechecksum(buf: bytearray) -> None:
    """Recompute the header checksum after a deliberate edit (a well-formed foreign entry)."""
    header = read_header_unchecked(buf)
    trailer = buf[header["trailer_at"] : header["total"]]
    h = xxhash.xxh3_64()
    h.update(bytes(buf[:CHECKSUM_AT]))
    h.update(bytes(buf[CHECKSUM_AT + 8 : ALIGN]))
    h.update(bytes(trailer))
    struct.pack_into("<Q", buf, CHECKSUM_AT, h.intdigest())


def read_header_unchecked(buf: Any) -> dict[str, Any]:
    fields = HEADER.unpack_from(buf)
    return {"version": fields[1], "total": fields[4], "trailer_at": fields[5]}


# -- round trips --------------------------------------------------------------------------------


def test_round_trip_of_several_sections() -> None:
    buf, sections = _small_entry()
    entry = parse_entry(buf)
    assert [bytes(s) for s in entry.sections] == sections
    assert entry.key == KEY
    assert entry.serializer == "standard"
    assert entry.meta == {"m": 1}
    assert entry.header.sections == len(sections)
    assert entry.header.total == len(buf)
    assert entry.header.created == CREATED
    assert entry.header.expires == EXPIRES
    assert entry.header.flags == 0


def test_sections_are_views_into_the_buffer_not_copies() -> None:
    buf, _ = _small_entry()
    entry = parse_entry(buf)
    for section in entry.sections:
        assert section.obj is buf
    buf[_section_table(buf)[0][0]] ^= 0xFF  # the view sees a later change to the buffer
    assert bytes(entry.sections[0]) != b"hello"


def test_every_section_and_the_trailer_start_on_a_64_byte_boundary() -> None:
    sizes = [0, 1, 63, 64, 65, 127, 128, 200]
    buf = entry_bytes(KEY, _encoded(*(b"x" * n for n in sizes)), created=0.0, expires=None)
    table = _section_table(buf)
    assert [length for _, length, _ in table] == sizes
    offsets = [offset for offset, _, _ in table]
    assert offsets[0] == ALIGN
    assert all(offset % ALIGN == 0 for offset in offsets)
    assert offsets == sorted(offsets)
    assert read_header(buf).trailer_at % ALIGN == 0
    parsed = parse_entry(buf)
    assert [s.nbytes for s in parsed.sections] == sizes


def test_no_sections_and_no_expiry() -> None:
    buf = entry_bytes(KEY, _encoded(meta=[1, "two"]), created=CREATED, expires=None)
    entry = parse_entry(buf)
    assert entry.sections == []
    assert entry.meta == [1, "two"]
    assert entry.header.expires == 0.0
    assert not entry.header.expired(time.time() + 1e9)


def test_header_expired() -> None:
    entry = parse_entry(entry_bytes(KEY, _encoded(b"x"), created=CREATED, expires=EXPIRES))
    assert not entry.header.expired(EXPIRES - 1)
    assert entry.header.expired(EXPIRES)
    assert entry.header.expired(EXPIRES + 1)


def test_streamed_sections_written_by_callables() -> None:
    import numpy as np

    array = np.arange(10, dtype="<i8")
    seen_tells: list[int] = []

    def streamed(out: Any) -> None:
        assert out.writable()
        seen_tells.append(out.tell())
        out.write(b"abc")
        seen_tells.append(out.tell())
        out.write(array)  # a non-byte buffer is written as its raw bytes
        out.write(memoryview(b"xyz"))
        seen_tells.append(out.tell())
        out.flush()

    encoded = _encoded(b"before", streamed, b"after")
    assert not encoded.in_memory
    assert encoded.buffered_size() == len(b"before") + len(b"after")
    entry = parse_entry(entry_bytes(KEY, encoded, created=0.0, expires=None))
    assert bytes(entry.sections[0]) == b"before"
    assert bytes(entry.sections[1]) == b"abc" + array.tobytes() + b"xyz"
    assert bytes(entry.sections[2]) == b"after"
    assert seen_tells == [0, 3, 3 + array.nbytes + 3]


def test_in_memory_sections() -> None:
    encoded = _encoded(b"ab", bytearray(b"cde"), memoryview(b"f"))
    assert encoded.in_memory
    assert encoded.buffered_size() == 6


class _FileSink:
    def __init__(self, f: Any) -> None:
        self.f = f

    def write(self, data: Any) -> None:
        self.f.write(data)

    def patch(self, offset: int, data: bytes) -> None:
        here = self.f.tell()
        self.f.seek(offset)
        self.f.write(data)
        self.f.seek(here)


def test_every_section_of_a_large_streamed_entry_carries_a_digest(tmp_path: Path) -> None:
    """Large sections (hashed on the other core) and streamed ones get digests too, so that a
    flipped bit in a mapped entry is found where sections are checked (verify=True)."""
    path = tmp_path / "entry.bin"
    big = bytes(range(256)) * (5 << 12)  # 5 MiB: past the size hashed in a helper thread

    def streamed(out: Any) -> None:
        for _ in range(3):
            out.write(b"piece")

    with open(path, "wb") as f:
        write_entry(_FileSink(f), KEY, _encoded(b"small", big, streamed),
                    created=CREATED, expires=EXPIRES)
    data = bytearray(path.read_bytes())
    table = _section_table(data)
    assert [row[2] for row in table] == [xxhash.xxh3_64_intdigest(b) for b in
                                         (b"small", big, b"piece" * 3)]
    assert parse_entry(data, check_sections=False).sections[1] == big
    data[table[1][0] + 3_000_000] ^= 1  # one flipped bit in the large section
    parse_entry(data, check_sections=False)  # a mapped read does not look (O(1))
    with pytest.raises(CorruptEntryError, match="section 1 checksum mismatch"):
        parse_entry(data)


def _with_trailer(buf: bytearray, trailer: dict[str, Any]) -> bytearray:
    """``buf`` with another trailer, its size and checksum fixed as docs/format.md defines."""
    packed = msgpack.packb(trailer, use_bin_type=True)
    forged = bytearray(buf[:read_header(buf).trailer_at]) + packed
    struct.pack_into("<Q", forged, 16, len(forged))  # total
    checksum = xxhash.xxh3_64(bytes(forged[:48]) + bytes(forged[56:64]) + packed).intdigest()
    struct.pack_into("<Q", forged, 48, checksum)
    return forged


def test_a_digest_is_an_int_or_nil() -> None:
    buf, sections = _small_entry()
    trailer = msgpack.unpackb(bytes(buf[read_header(buf).trailer_at:]), raw=False)
    trailer["sec"][1][2] = "0"
    with pytest.raises(CorruptEntryError, match="section 1 is described wrongly"):
        parse_entry(_with_trailer(buf, trailer))
    trailer["sec"][1][2] = None  # not hashed
    assert [bytes(s) for s in parse_entry(_with_trailer(buf, trailer)).sections] == sections


def test_write_entry_into_a_file_sink(tmp_path: Path) -> None:
    path = tmp_path / "entry.bin"
    with open(path, "wb") as f:
        total = write_entry(
            _FileSink(f), KEY, _encoded(b"one", lambda out: out.write(b"two")),
            created=CREATED, expires=EXPIRES,
        )
    data = path.read_bytes()
    assert total == len(data)
    entry = parse_entry(data)
    assert [bytes(s) for s in entry.sections] == [b"one", b"two"]
    assert bytes(entry_bytes(
        KEY, _encoded(b"one", b"two"), created=CREATED, expires=EXPIRES
    )) == data  # streaming or not, the same bytes


def test_parse_accepts_bytes_bytearray_and_memoryview() -> None:
    buf, sections = _small_entry()
    for form in (bytes(buf), buf, memoryview(buf), memoryview(bytes(buf)).cast("c")):
        assert [bytes(s) for s in parse_entry(form).sections] == sections


_sections = st.lists(st.binary(max_size=300), max_size=8)
_meta = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=10,
)


@given(
    sections=_sections,
    streamed=st.lists(st.booleans(), min_size=8, max_size=8),
    meta=_meta,
    namespace=st.text(min_size=1, max_size=20),
    function=st.text(min_size=1, max_size=40),
    digest=st.binary(min_size=16, max_size=16),
    expires=st.none() | st.floats(min_value=1.0, max_value=1e10),
)
@settings(max_examples=150, deadline=None)
def test_random_round_trips(
    sections: list[bytes], streamed: list[bool], meta: Any, namespace: str, function: str,
    digest: bytes, expires: float | None,
) -> None:
    def stream(data: bytes) -> Any:
        def write(out: Any) -> None:
            for start in range(0, len(data), 37):
                out.write(data[start : start + 37])

        return write

    parts = [stream(s) if streamed[i] else s for i, s in enumerate(sections)]
    key = Key(namespace, function, digest)
    buf = entry_bytes(key, Encoded("ser", meta, parts, flags=0), created=CREATED, expires=expires)
    entry = parse_entry(buf)
    assert [bytes(s) for s in entry.sections] == sections
    assert entry.key == key
    assert entry.meta == meta
    assert entry.header.expires == (expires or 0.0)
    assert all(offset % ALIGN == 0 for offset, _, _ in _section_table(buf))
    assert len(buf) == entry.header.total


# -- corruption ---------------------------------------------------------------------------------


def _assert_flip_never_misparses(buf: bytearray, check_sections: bool) -> list[int]:
    """Flip every byte in three ways; return the positions whose flip went undetected."""
    original = parse_entry(bytes(buf))
    want = ([bytes(s) for s in original.sections], original.key, original.meta,
            original.serializer, original.header)
    protected = _protected_ranges(buf)
    undetected = []
    for position in range(len(buf)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(buf)
            damaged[position] ^= mask
            try:
                entry = parse_entry(damaged, check_sections=check_sections)
            except CorruptEntryError:
                continue
            got = ([bytes(s) for s in entry.sections], entry.key, entry.meta,
                   entry.serializer, entry.header)
            in_section = any(position in r for r in protected[2:])
            if check_sections or not in_section:
                assert got == want, f"flip {mask:#x} at byte {position} parsed to other data"
                assert not any(position in r for r in protected), (
                    f"flip {mask:#x} at checksummed byte {position} went undetected"
                )
            undetected.append(position)
    return undetected


def test_every_single_byte_flip_is_detected_or_harmless() -> None:
    buf, _ = _small_entry()
    undetected = _assert_flip_never_misparses(buf, check_sections=True)
    # Only padding is unprotected; and there is padding in this entry, so the check ran.
    assert undetected
    assert all(not any(p in r for r in _protected_ranges(buf)) for p in undetected)


def test_without_section_checks_header_and_trailer_flips_are_still_detected() -> None:
    buf, _ = _small_entry()
    undetected = set(_assert_flip_never_misparses(buf, check_sections=False))
    header = read_header(buf)
    for position in [*range(ALIGN), *range(header.trailer_at, header.total)]:
        assert position not in undetected, f"flip at byte {position} went undetected"
    # ...while section data is deliberately not hashed (the documented trade-off).
    first_offset = _section_table(buf)[0][0]
    assert first_offset in undetected


def test_section_flip_is_reported_as_a_section_checksum_mismatch() -> None:
    buf, _ = _small_entry()
    buf[_section_table(buf)[2][0] + 5] ^= 0x10
    with pytest.raises(CorruptEntryError, match="section 2"):
        parse_entry(buf)


def test_truncation_at_every_length_is_detected() -> None:
    buf, _ = _small_entry()
    for length in range(len(buf)):
        with pytest.raises(CorruptEntryError):
            parse_entry(bytes(buf[:length]))
        with pytest.raises(CorruptEntryError):
            parse_entry(bytes(buf[:length]), check_sections=False)


@pytest.mark.parametrize("extra", [b"\0", b"x" * 64])
def test_trailing_bytes_are_detected(extra: bytes) -> None:
    buf, _ = _small_entry()
    with pytest.raises(CorruptEntryError, match="truncated or padded"):
        parse_entry(bytes(buf) + extra)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello",
        b"\x89PNG\r\n\x1a\n" + bytes(200),  # a PNG, whose signature our magic resembles
        b"PK\x03\x04" + bytes(100),
        bytes(64),
        bytes(range(256)),
        msgpack.packb({"key": b"x"}),
    ],
)
def test_foreign_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(CorruptEntryError):
        parse_entry(data)


@given(st.binary(max_size=400))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_random_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(CorruptEntryError):
        parse_entry(data)


@given(st.binary(min_size=ALIGN, max_size=300))
@settings(max_examples=200)
def test_random_bytes_behind_our_magic_are_refused(data: bytes) -> None:
    forged = MAGIC + struct.pack("<H", FORMAT_VERSION) + data[10:]
    with pytest.raises(CorruptEntryError):
        parse_entry(forged)


def test_bad_magic_message() -> None:
    buf, _ = _small_entry()
    buf[0] ^= 0xFF
    with pytest.raises(CorruptEntryError, match="bad magic"):
        parse_entry(buf)


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0xFFFF])
def test_future_format_version_asks_for_an_upgrade(version: int) -> None:
    buf, _ = _small_entry()
    struct.pack_into("<H", buf, VERSION_AT, version)
    _rechecksum(buf)  # a well-formed entry of a newer format, not a damaged one
    with pytest.raises(CorruptEntryError, match="upgrad") as excinfo:
        parse_entry(buf)
    assert str(version) in str(excinfo.value)
    with pytest.raises(CorruptEntryError, match="upgrad"):
        read_header(buf)


def test_section_table_pointing_outside_the_entry_is_refused() -> None:
    """A trailer with a valid checksum but lying offsets (a forged entry) is still refused."""
    buf, _ = _small_entry()
    header = read_header(buf)
    trailer = msgpack.unpackb(bytes(buf[header.trailer_at :]), raw=False)
    for bad in ([ALIGN + 1, 3, 0], [0, 3, 0], [ALIGN, header.trailer_at, 0]):
        forged_trailer = dict(trailer, sec=[bad, *trailer["sec"][1:]])
        packed = msgpack.packb(forged_trailer, use_bin_type=True)
        forged = bytearray(buf[: header.trailer_at]) + packed
        struct.pack_into("<QQ", forged, 16, len(forged), header.trailer_at)
        _rechecksum(forged)
        with pytest.raises(CorruptEntryError, match="outside"):
            parse_entry(forged, check_sections=False)


def test_stream_file_objects_work_with_io_helpers() -> None:
    """A streamed section can be produced by code that expects a binary file (shutil-style)."""
    source = io.BytesIO(b"z" * 1000)

    def copy(out: Any) -> None:
        while chunk := source.read(128):
            out.write(chunk)

    entry = parse_entry(entry_bytes(KEY, _encoded(copy), created=0.0, expires=None))
    assert bytes(entry.sections[0]) == b"z" * 1000
