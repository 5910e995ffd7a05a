"""Entries larger than a store's item size, as chunks behind a small manifest (Redis, Memcached).

Chunks are written under a fresh version id before the manifest replaces the entry's value, so a
reader sees the old entry or the new one; a missing chunk makes the entry a miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

MANIFEST = b"\x89ASTCHUNK"


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
    valid = (isinstance(manifest, dict) and isinstance(manifest.get("v"), str)
             and isinstance(manifest.get("n"), int) and isinstance(manifest.get("size"), int))
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
