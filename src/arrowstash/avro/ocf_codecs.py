"""The codecs of container-file blocks: compression on write, and decompression on read held
to a budget, so that a block that claims (or inflates to) gigabytes is refused after at most
the budget and one piece, whatever its codec."""

from __future__ import annotations

import bz2
import functools
import lzma
import zlib
from collections.abc import Callable
from typing import Any, cast

import pyarrow as pa

from arrowstash.errors import AvroDecodeError

__all__ = ["CODECS", "COMPRESS", "DECOMPRESS", "DECOMPRESS_ERRORS", "INFLATE_MAX_RATIO", "Budget",
           "Corrupt", "TooLarge", "bounded", "codec_name", "decompress_block", "inflater"]

#: Codec names as the specification spells them; "zstd" is accepted for "zstandard".
CODECS = ("null", "deflate", "snappy", "zstandard", "bzip2", "xz")
_ALIASES = {"zstd": "zstandard", None: "null"}


class Corrupt(Exception):
    """A block (or a header field) that is not what its codec or the format says."""


class TooLarge(Exception):
    """A block decompresses to more bytes than the reader has left to give."""


def codec_name(codec: str | None) -> str:
    """The specification's name of ``codec`` ("zstd" -> "zstandard", None -> "null")."""
    name = _ALIASES.get(codec, codec)
    if name not in CODECS:
        raise ValueError(f"unknown Avro codec {codec!r}; choose one of {CODECS} (or 'zstd')")
    return str(name)


def _snappy_module() -> Any:
    for module in ("cramjam", "snappy"):
        try:
            return __import__(module)
        except ImportError:
            continue
    raise ImportError("the snappy codec needs Arrow's snappy or a package: "
                      "pip install cramjam (or python-snappy)")


def _snappy_decompress(data: memoryview, room: int) -> bytes | pa.Buffer:
    if len(data) < 4:
        raise Corrupt("snappy block shorter than its CRC")
    body, crc = data[:-4], bytes(data[-4:])
    if _uvarint(body) > room:
        raise TooLarge
    if pa.Codec.is_available("snappy"):
        out: bytes | pa.Buffer = pa.Codec("snappy").decompress(
            body, decompressed_size=_uvarint(body))
    else:
        module = _snappy_module()
        out = bytes(module.snappy.decompress_raw(bytes(body)) if module.__name__ == "cramjam"
                    else module.decompress(bytes(body)))
    if zlib.crc32(out).to_bytes(4, "big") != crc:
        raise Corrupt("snappy block fails its CRC-32 check")
    return out


def _snappy_compress(data: memoryview) -> bytes:
    if pa.Codec.is_available("snappy"):
        body = pa.Codec("snappy").compress(data, asbytes=True)
    else:
        module = _snappy_module()
        body = bytes(module.snappy.compress_raw(bytes(data)) if module.__name__ == "cramjam"
                     else module.compress(bytes(data)))
    return bytes(body) + zlib.crc32(data).to_bytes(4, "big")


def _uvarint(data: memoryview) -> int:
    """The uncompressed length snappy stores in front of its raw format."""
    result = shift = 0
    for byte in data[:5]:
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result
        shift += 7
    raise Corrupt("snappy block has no valid length preamble")


def _zstd_decompress(data: memoryview, room: int) -> pa.Buffer:
    # A stream, not pa.Codec: Java's writer leaves the content size out of its frames. Read in
    # pieces, so that a frame claiming gigabytes allocates no more than ``room`` and a piece.
    stream = pa.CompressedInputStream(pa.BufferReader(data), "zstd")
    pieces = []
    got = 0
    while True:
        want = min(_PIECE, room + 1 - got)
        piece = stream.read_buffer(want)
        pieces.append(piece)
        got += piece.size
        if got > room:
            raise TooLarge
        if piece.size < want:
            break
    return pieces[0] if len(pieces) == 1 else pa.py_buffer(b"".join(pieces))


_PIECE = 64 << 20


@functools.cache
def inflater() -> tuple[Callable[[memoryview], bytes], tuple[type[Exception], ...]]:
    """Raw (RFC 1951) inflate and its error types: ISA-L's when the ``isal`` package is
    installed (the ``avro`` extra; two to three times zlib's speed, same output), else zlib."""
    try:
        from isal import isal_zlib
    except ImportError:
        return (lambda data: zlib.decompress(data, -15)), (zlib.error,)
    isal_error = cast("type[Exception]", isal_zlib.error)  # its stub calls it an instance
    return (lambda data: isal_zlib.decompress(data, wbits=-15)), (zlib.error, isal_error)


#: Raw deflate expands a block at most about 1032 times (plus a little for tiny blocks).
INFLATE_MAX_RATIO = 1032


def _inflate(data: memoryview, room: int = 1 << 62) -> bytes:
    inflate, errors = inflater()
    if len(data) * INFLATE_MAX_RATIO + 65536 > room:  # could pass room: inflate step by step
        return bounded(zlib.decompressobj(-15), data, room)
    try:
        return inflate(data)
    except errors as exc:
        raise Corrupt(str(exc)) from None


def bounded(decompressor: Any, data: memoryview, room: int) -> bytes:
    """One stream of ``data`` through ``decompressor``, stopped past ``room`` bytes."""
    out = decompressor.decompress(data, room + 1)
    if len(out) > room:
        raise TooLarge
    if not decompressor.eof:
        raise Corrupt("the compressed stream ends early")
    return bytes(out)


DECOMPRESS: dict[str, Callable[[memoryview, int], Any]] = {
    "null": lambda data, room: data,
    "deflate": _inflate,
    "snappy": _snappy_decompress,
    "zstandard": _zstd_decompress,
    "bzip2": lambda data, room: bounded(bz2.BZ2Decompressor(), data, room),
    "xz": lambda data, room: bounded(lzma.LZMADecompressor(), data, room),
}


def _deflate(data: memoryview, level: int | None) -> bytes:
    compressor = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


COMPRESS: dict[str, Callable[[memoryview, int | None], Any]] = {
    "null": lambda data, level: data,
    "deflate": _deflate,
    "snappy": lambda data, level: _snappy_compress(data),
    "zstandard": lambda data, level: pa.Codec("zstd", level).compress(data, asbytes=True),
    "bzip2": lambda data, level: bz2.compress(data, 9 if level is None else level),
    "xz": lambda data, level: lzma.compress(data, preset=level),
}


#: What a codec raises on a corrupt block.
DECOMPRESS_ERRORS = (Corrupt, zlib.error, OSError, EOFError, ValueError, pa.ArrowException,
                      lzma.LZMAError)


class Budget:
    """The bytes a file's compressed blocks may still decompress to (``max_bytes`` in all)."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.left = (1 << 62) if max_bytes is None else max_bytes

    def share(self, part: int, whole: int) -> Budget:
        """A budget for a run of ``part`` of the ``whole`` compressed bytes (its fair share)."""
        if self.max_bytes is None:
            return Budget(None)
        return Budget(self.max_bytes * part // max(whole, 1))


def decompress_block(codec: str, block: Any, budget: Budget) -> Any:
    try:
        out = DECOMPRESS[codec](block.data, budget.left)
    except TooLarge:
        raise AvroDecodeError(
            f"block {block.index} at byte {block.offset}: its {len(block.data)} bytes "
            f"decompress past max_bytes={budget.max_bytes} for the whole file; pass a larger "
            "max_bytes (or None) to read it"
        ) from None
    except DECOMPRESS_ERRORS as exc:
        raise AvroDecodeError(
            f"block {block.index} at byte {block.offset}: cannot {codec}-decompress its "
            f"{len(block.data)} bytes: {exc}"
        ) from None
    if codec != "null":
        budget.left -= memoryview(out).nbytes
    return out
