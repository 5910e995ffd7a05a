"""read_ocf's limits (issue 20, item 10): a few kilobytes of compressed blocks that declare or
inflate to gigabytes are refused fast, with an error naming the limit, by every codec and by
both inflaters; files within the limits read as before."""

from __future__ import annotations

import bz2
import gc
import lzma
import time
import zlib
from collections.abc import Callable

import pyarrow as pa
import pytest

from arrowstash.avro.ocf import MAX_BYTES, MAX_ROWS, _header_bytes, _long, read_ocf
from arrowstash.errors import AvroDecodeError

SCHEMA = b'{"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}]}'
SYNC = bytes(range(16))


def _deflate(data: bytes) -> bytes:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -15)
    return squeeze.compress(data) + squeeze.flush()


def _snappy(data: bytes) -> bytes:
    return bytes(pa.Codec("snappy").compress(data, asbytes=True)) + \
        zlib.crc32(data).to_bytes(4, "big")


COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "deflate": _deflate,
    "zstandard": lambda data: bytes(pa.Codec("zstd").compress(data, asbytes=True)),
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "snappy": _snappy,
}


def _file(codec: str, blocks: list[tuple[int, bytes]]) -> bytes:
    """A container file of ``(datum count, compressed payload)`` blocks: x is the int 0, one
    zero byte per row, so ``n`` zero bytes are ``n`` rows."""
    out = bytearray(_header_bytes({"avro.schema": SCHEMA, "avro.codec": codec.encode()}, SYNC))
    for count, payload in blocks:
        out += _long(count) + _long(len(payload)) + payload + SYNC
    return bytes(out)


def _bomb(codec: str, inflated: int, blocks: int = 1) -> bytes:
    zeros = COMPRESS[codec](bytes(inflated // blocks))
    return _file(codec, [(inflated // blocks, zeros)] * blocks)


def test_the_defaults_are_documented_and_sane() -> None:
    assert MAX_ROWS == 1 << 28 and MAX_BYTES == 1 << 32
    doc = read_ocf.__doc__ or ""
    assert "max_rows" in doc and "max_bytes" in doc


def test_a_file_declaring_2_to_the_30_rows_is_refused_before_any_decompression() -> None:
    """The 32 kB zstandard file of the issue: its one block declares 2**30 rows."""
    data = _file("zstandard", [(1 << 30, COMPRESS["zstandard"](bytes(1 << 20)))])
    gc.collect()  # in the whole suite a full collection of its heap once fell in this window
    gc.disable()
    try:
        started = time.process_time()  # CPU time: a loaded machine's stall is not the code's
        with pytest.raises(AvroDecodeError, match=r"declare 1073741824 rows, more than "
                                                  r"max_rows=268435456"):
            read_ocf(data)
        assert time.process_time() - started < 0.1
    finally:
        gc.enable()


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_a_block_inflating_past_max_bytes_is_refused(codec: str) -> None:
    data = _bomb(codec, 8 << 20)
    assert len(data) < (512 << 10 if codec == "snappy" else 64 << 10)  # snappy: at most 1:21
    with pytest.raises(AvroDecodeError, match=r"block 0 at byte \d+: its \d+ bytes decompress "
                                              r"past max_bytes=1048576 for the whole file"):
        read_ocf(data, max_bytes=1 << 20)


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_exactly_max_bytes_reads(codec: str) -> None:
    data = _bomb(codec, 1 << 16, blocks=4)
    for threads in (1, 2):
        assert read_ocf(data, max_bytes=1 << 16, threads=threads).num_rows == 1 << 16
        with pytest.raises(AvroDecodeError, match="max_bytes=65535"):
            read_ocf(data, max_bytes=(1 << 16) - 1, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_deflate_bomb_of_many_blocks_stops_at_the_budget(inflate: str, threads: int) -> None:
    """64 blocks of 1 MiB of zeros, 1 kB each deflated: refused once 4 MiB are inflated, by the
    native inflater (each thread held to its share) and by Python's, and fast."""
    data = _bomb("deflate", 64 << 20, blocks=64)
    assert len(data) < 96 << 10
    started = time.perf_counter()
    with pytest.raises(AvroDecodeError, match=r"block 4 at byte \d+: .* past max_bytes=4194304"):
        read_ocf(data, max_bytes=4 << 20, threads=threads)
    assert time.perf_counter() - started < 2.0


def test_max_rows_refuses_and_none_lifts_the_limits() -> None:
    data = _bomb("zstandard", 1 << 12, blocks=2)
    with pytest.raises(AvroDecodeError, match="max_rows=4095"):
        read_ocf(data, max_rows=(1 << 12) - 1)
    assert read_ocf(data, max_rows=1 << 12, max_bytes=1 << 12).num_rows == 1 << 12
    assert read_ocf(data, max_rows=None, max_bytes=None).num_rows == 1 << 12


@pytest.mark.parametrize("bad", [-1, True, 1.5, "10"])
def test_limits_must_be_non_negative_ints_or_none(bad: object) -> None:
    with pytest.raises(ValueError, match="max_rows must be a non-negative int or None"):
        read_ocf(_bomb("zstandard", 16), max_rows=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes must be a non-negative int or None"):
        read_ocf(_bomb("zstandard", 16), max_bytes=bad)  # type: ignore[arg-type]
