"""Entries signed with a keyed MAC (issue 20, item 3): with a secret, every entry of every
serializer carries a MAC of each section and a tag over header and trailer; a forged one (its
unkeyed checksums recomputed, as anyone able to write to the store can) is a logged miss. And a
damaged entry's metadata is never an exception to the caller, with or without a secret."""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import xxhash

from arrowstash import FileBackend, MemoryBackend, cache
from arrowstash.backends.base import Stored
from arrowstash.caching.pipeline import MISSING
from arrowstash.entry import Key
from arrowstash.entry.format import (
    FLAG_SIGNED,
    entry_bytes,
    materialize,
    parse_entry,
    read_header,
    verify_sections,
)
from arrowstash.errors import CorruptEntryError
from arrowstash.serializers.registry import REGISTRY

sys.path.insert(0, str(Path(__file__).parents[1] / "contract"))
from test_serializer_contract import CASES

SECRET = b"mac-test-secret"


def _signed(name: str, secret: bytes | None = SECRET) -> tuple[Key, bytearray]:
    serializer = REGISTRY[name]()
    key = Key("mac", f"tests.{name}", b"\x02" * 16)
    encoded = materialize(serializer.encode(CASES[name][0]()))
    encoded.sign_with = secret
    return key, entry_bytes(key, encoded, created=time.time(), expires=None)


def _reseal(data: bytearray, trailer: bytes | None = None) -> bytearray:
    """What a forger without the secret can do: replace the trailer and recompute the header's
    size and unkeyed checksum (docs/format.md), so every unkeyed check passes."""
    at = read_header(data).trailer_at
    if trailer is None:
        trailer = bytes(data[at:])
    forged = bytearray(data[:at]) + trailer
    struct.pack_into("<Q", forged, 16, len(forged))
    checksum = xxhash.xxh3_64(bytes(forged[:48]) + bytes(forged[56:64]) + trailer).intdigest()
    struct.pack_into("<Q", forged, 48, checksum)
    return forged


def _trailer(data: bytearray) -> dict[str, Any]:
    info: dict[str, Any] = msgpack.unpackb(bytes(data[read_header(data).trailer_at:]),
                                           raw=False, strict_map_key=False)
    return info


def _load(data: bytearray, key: Key, secret: bytes | None, **options: Any) -> tuple[Any, int]:
    fn: Any = cache(backend=MemoryBackend(), secret=secret, **options)(lambda: None)
    value, _ = fn._core.load_entry(key, Stored(memoryview(data)), True)
    return value, fn.cache_info().errors


@pytest.fixture(params=sorted(CASES))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_serializer_is_signed_and_reads_back(name: str) -> None:
    key, data = _signed(name)
    entry = parse_entry(data, secret=SECRET)
    assert entry.header.flags & FLAG_SIGNED
    assert entry.trailer.smac is not None and len(entry.trailer.smac) == len(entry.sections)
    value, errors = _load(data, key, SECRET)
    assert errors == 0 and CASES[name][1](value, CASES[name][0]())
    with pytest.raises(CorruptEntryError, match="signature does not match"):
        parse_entry(data, secret=b"another secret")
    with pytest.raises(CorruptEntryError, match="no valid signature"):
        parse_entry(_signed(name, None)[1], secret=SECRET)


def test_a_forged_metadata_passes_unkeyed_checks_but_not_the_tag(name: str) -> None:
    key, data = _signed(name)
    trailer = _trailer(data)
    trailer["meta"] = {"forged": 536_870_912}
    forged = _reseal(data, msgpack.packb(trailer, use_bin_type=True))
    parse_entry(forged)  # every unkeyed check passes
    with pytest.raises(CorruptEntryError, match="signature does not match"):
        parse_entry(forged, secret=SECRET)
    assert _load(forged, key, SECRET) == (MISSING, 1)


def test_a_forged_section_with_its_digest_recomputed_fails_its_mac(name: str) -> None:
    key, data = _signed(name)
    trailer = _trailer(data)
    offset, length, _ = trailer["sec"][-1]
    if not length:
        pytest.skip("an empty last section")
    data[offset + length // 2] ^= 0x20
    trailer["sec"][-1][2] = xxhash.xxh3_64_intdigest(bytes(data[offset : offset + length]))
    packed = msgpack.packb(trailer, use_bin_type=True)
    forged = _reseal(data, packed)
    parse_entry(forged)  # the unkeyed digest was recomputed: passes
    with pytest.raises(CorruptEntryError, match=r"signature does not match|fails its MAC"):
        parse_entry(forged, secret=SECRET)
    assert _load(forged, key, SECRET) == (MISSING, 1)


@pytest.mark.parametrize("meta", [None, 7, [1, 2], "x", {"a": None}, {}])
def test_malformed_metadata_is_a_logged_miss_without_a_secret(name: str, meta: Any) -> None:
    key, data = _signed(name, None)
    trailer = _trailer(data)
    if trailer["meta"] is None:
        pytest.skip("this serializer keeps no metadata")
    trailer["meta"] = meta
    forged = _reseal(data, msgpack.packb(trailer, use_bin_type=True))
    value, errors = _load(forged, key, None, serializer="buffers" if name == "buffers" else
                          "auto")
    if value is not MISSING:  # decoded to something: then it is the very value stored
        assert CASES[name][1](value, CASES[name][0]())
    else:
        assert errors == 1


def test_the_tag_is_the_last_trailer_field_and_covers_the_header() -> None:
    _, data = _signed("standard")
    assert list(_trailer(data))[-1] == "tag"
    later = bytearray(data)
    struct.pack_into("<d", later, 40, time.time() + 3600)  # a later expiry, resealed
    with pytest.raises(CorruptEntryError, match="signature does not match"):
        parse_entry(_reseal(later), secret=SECRET)
    parse_entry(_reseal(later))


def test_a_mapped_hit_is_checked_with_verify(tmp_path: Path) -> None:
    """A mapped hit stays O(1) (tag only) unless verify=True, which checks every section."""
    backend = FileBackend(tmp_path / "cache", mmap_threshold=4096)
    calls: list[int] = []

    def make(verify: bool) -> Any:
        @cache(backend=backend, l1=False, secret=SECRET, verify=verify)
        def big(n: int) -> np.ndarray:
            calls.append(n)
            return np.arange(n, dtype=np.float64)

        return big

    plain, verifying = make(False), make(True)
    assert plain(1 << 17)[5] == 5.0
    path = Path(backend.path(plain.cache_key(1 << 17)))
    entry = parse_entry(path.read_bytes(), check_sections=False)
    offset, length, _ = entry.trailer.sections[-1]
    with open(path, "r+b") as f:  # a bit flips on the disk
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    flipped = plain(1 << 17)
    assert calls == [1 << 17]  # served zero-copy from the map, unchecked (the documented cost)
    assert not np.array_equal(flipped, np.arange(1 << 17, dtype=np.float64))
    with pytest.raises(CorruptEntryError, match=r"fails its MAC|checksum mismatch"):
        verify_sections(parse_entry(path.read_bytes(), check_sections=False), SECRET)
    assert np.array_equal(verifying(1 << 17), np.arange(1 << 17, dtype=np.float64))
    assert calls == [1 << 17, 1 << 17] and verifying.cache_info().errors == 1
