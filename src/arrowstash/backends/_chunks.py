"""Entries larger than a store's item size, as chunks behind a small manifest (Redis, Memcached).

Chunks are written under a fresh version id before the manifest replaces the entry's value, so a
reader sees the old entry or the new one; a missing chunk makes the entry a miss.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgpack

MANIFEST = b"\x89ASTCHUNK"
#: Bounds a reader holds a manifest to, so that a forged one cannot make it allocate or fetch
#: without limit: at most this many chunks (64 Ki chunks of 64 MiB is 4 TiB) ...
MAX_CHUNKS = 1 << 16
#: ... and no entry above 1 TiB.
MAX_SIZE = 1 << 40
_VERSION = re.compile(r"[0-9a-f]{16}")


def pack_manifest(manifest: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(manifest)
    return MANIFEST + packed


def read_manifest(value: bytes) -> dict[str, Any] | None:
    """The manifest a stored value holds; None if it is not one, or not a valid one."""
    if not value.startswith(MANIFEST):
        return None
    try:
        manifest = msgpack.unpackb(value[len(MANIFEST) :], raw=False)
    except (ValueError, msgpack.UnpackException):
        return None
    if not isinstance(manifest, dict):
        return None
    version, count, size = manifest.get("v"), manifest.get("n"), manifest.get("size")
    valid = (type(version) is str and _VERSION.fullmatch(version) is not None
             and type(count) is int and type(size) is int
             and 1 <= count <= min(MAX_CHUNKS, max(size, 1)) and 0 <= size <= MAX_SIZE)
    return manifest if valid else None


def chunk_names(base: str, manifest: dict[str, Any]) -> list[str]:
    return [f"{base}:c:{manifest['v']}:{i}" for i in range(manifest["n"])]


def join(parts: Sequence[bytes], size: int) -> bytearray | None:
    """The entry's bytes from its chunks (the one copy a chunked read makes)."""
    if sum(len(part) for part in parts) != size:
        return None
    data = bytearray(size)
    offset = 0
    for part in parts:
        data[offset : offset + len(part)] = part
        offset += len(part)
    return data
