"""The one place where arrowstash reads its environment.

- ``ARROWSTASH_URL``: the default backend (``file:///path``, ``memory://``, ...); ``?encrypt=1``
  on a file or network URL makes it encrypt every entry.
- ``ARROWSTASH_ARROW_COMPRESSION``: "zstd", "lz4" or "none", overriding the per-backend default
  compression of frames.
- ``ARROWSTASH_MAX_VALUE_BYTES``: how far a compressed stored value may expand when loaded.
- ``ARROWSTASH_SECRET``: the key that signs every entry (docs/network-security.md).
- ``ARROWSTASH_KEY``: the base64 AES-256 key of ``encrypt=True``; ``ARROWSTASH_PREVIOUS_KEYS``:
  older keys, comma-separated, that still decrypt (see docs/encryption.md).
- ``XDG_CACHE_HOME`` (or the platform's equivalent): where the default File backend lives.
- ``ARROWSTASH_AVRO_NATIVE=0``: the Avro codec uses its pure-Python decoder and encoder even
  where the native ones are built; ``ARROWSTASH_AVRO_LIBDEFLATE=0``: the native decoder leaves
  deflate blocks to Python's zlib instead of the system's libdeflate.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def default_url() -> str | None:
    return os.environ.get("ARROWSTASH_URL") or None


def default_cache_dir() -> Path:
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "arrowstash"


def arrow_compression(default: str | None) -> str | None:
    raw = os.environ.get("ARROWSTASH_ARROW_COMPRESSION", "").strip()
    if not raw:
        return default
    value = raw.lower()
    if value in ("none", "off", "uncompressed"):
        return None
    if value in ("zstd", "lz4"):
        return value
    raise ValueError(f"ARROWSTASH_ARROW_COMPRESSION={raw!r}: expected zstd, lz4 or none")


def max_value_bytes(stored: int) -> int:
    """How many bytes a stored section of ``stored`` bytes may decompress to when loaded:
    ``ARROWSTASH_MAX_VALUE_BYTES`` if set, else 1024 times its size or 1 GiB, the larger."""
    raw = os.environ.get("ARROWSTASH_MAX_VALUE_BYTES", "").strip()
    if not raw:
        return max(1 << 30, stored << 10)
    if not raw.isdigit() or not int(raw):
        raise ValueError(f"ARROWSTASH_MAX_VALUE_BYTES={raw!r}: expected a positive number of "
                         "bytes")
    return int(raw)


def secret() -> bytes | None:
    value = os.environ.get("ARROWSTASH_SECRET")
    return value.encode() if value else None


def encryption_keys() -> tuple[str | None, list[str]]:
    """The current encryption key and the previous ones, as text (entry.crypto parses them)."""
    current = os.environ.get("ARROWSTASH_KEY", "").strip() or None
    previous = os.environ.get("ARROWSTASH_PREVIOUS_KEYS", "")
    return current, [k.strip() for k in previous.split(",") if k.strip()]


def avro_native() -> bool:
    """Whether the Avro codec may use its native decoder and encoder (where they are built)."""
    return os.environ.get("ARROWSTASH_AVRO_NATIVE", "1") != "0"


def avro_libdeflate() -> bool:
    """Whether the native Avro decoder may inflate deflate blocks with libdeflate."""
    return os.environ.get("ARROWSTASH_AVRO_LIBDEFLATE", "1") != "0"


def avro_max_empty_items() -> int:
    """How many array or map items that take no bytes (nulls, empty records) one decode may
    produce beyond its input's size in bytes: the bound on the work of a tiny hostile message."""
    raw = os.environ.get("ARROWSTASH_AVRO_MAX_EMPTY_ITEMS", "").strip()
    if not raw:
        return 1 << 20
    if not raw.isdigit():
        raise ValueError(f"ARROWSTASH_AVRO_MAX_EMPTY_ITEMS={raw!r}: expected a count >= 0")
    return int(raw)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - not Linux
