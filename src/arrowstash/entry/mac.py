"""Keyed MACs of entries: what lets a reader holding the secret refuse an entry that anyone able
to write to the store (another user of a folder, a client of a shared Redis) forged or altered.

An entry written under a secret carries, in its trailer, a 16-byte HMAC-SHA256 of every section
(``smac``, computed while the section streams out) and, as its last field, a 32-byte ``tag``:
the HMAC of the header (all but its unkeyed checksum) and of the trailer's bytes before the tag,
which hold the key, the serializer, the metadata, the section table and the section MACs. The
tag is checked on every read in O(1); section MACs are checked wherever sections are (every
read of a network store, a mapped file read with ``verify=True``, ``arrowstash verify``).
Both use a key derived from the secret, never the secret itself.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
from typing import Any

_DERIVE = b"arrowstash entry auth v2"
_SECTION = struct.Struct("<8sI")
SECTION_MAC = 16  # bytes of a section's MAC
TAG = 32  # bytes of the entry's tag
#: How the tag field ends a trailer: the MessagePack of the key "tag" and a 32-byte bin.
TAG_PREFIX = b"\xa3tag\xc4\x20"
TAIL = len(TAG_PREFIX) + TAG


@functools.lru_cache(maxsize=8)
def derive(secret: bytes) -> bytes:
    """The key entry MACs use: bound to this purpose, so a secret shared with other uses of
    HMAC never yields the same tags."""
    return hmac.new(secret, _DERIVE, hashlib.sha256).digest()


def section_mac(key: bytes, index: int) -> Any:
    """A running HMAC of section ``index``: feed it the section's bytes, then ``finish``."""
    return hmac.new(key, _SECTION.pack(b"section\0", index), hashlib.sha256)


def finish(running: Any) -> bytes:
    return bytes(running.digest()[:SECTION_MAC])


def tag(key: bytes, header: Any, body: Any) -> bytes:
    """The tag of an entry: its header's first 48 bytes and its trailer up to the tag field."""
    mac = hmac.new(key, b"tag\0", hashlib.sha256)
    mac.update(header[:48])
    mac.update(body)
    return mac.digest()


def same(a: bytes, b: Any) -> bool:
    return hmac.compare_digest(a, bytes(b))
