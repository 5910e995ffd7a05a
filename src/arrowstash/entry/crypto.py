"""AES-256-GCM encryption of entry sections, with key rotation (see docs/encryption.md).

Every section of an encrypted entry is a run of chunks, each sealed on its own with a fresh random
96-bit nonce; the last one is flagged, so a section cut short is detected:

    chunk: u32 (length | last << 31) | 12-byte nonce | ciphertext (length bytes) | 16-byte tag

The associated data of every chunk binds the entry's identity (namespace, function, key digest,
serializer, flags, created, expires, section count, metadata or not, key id) and the chunk's
place (section index, chunk index, offset in the section, length, last or not), so a chunk
that is altered, moved, reordered, dropped or replayed under another key fails to authenticate.
Sections are written chunk by chunk and decrypted straight into one buffer per section:
encrypting never holds a second copy of a value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

from arrowstash import config
from arrowstash.errors import CorruptEntryError

#: Plaintext bytes sealed per chunk: big enough that per-chunk costs vanish, small enough that a
#: streamed store buffers little.
CHUNK = 4 << 20
_MAX_CHUNK = 64 << 20  # what a reader accepts: a bound on a forged length field
NONCE = 12
TAG = 16
_FRAME = struct.Struct("<I")
_LAST = 1 << 31  # the frame's flag of a section's last chunk
_PLACE = struct.Struct("<IIQQB")  # section index, chunk index, offset, length, last
_OVERHEAD = _FRAME.size + NONCE + TAG  # bytes a chunk adds to its plaintext
_CONTEXT = b"arrowstash aes-256-gcm v1\0"
#: Sections at least this large decrypt into Arrow-allocated memory (64-byte aligned, not
#: zero-filled first); smaller ones into a bytearray.
_ARROW_BUFFER_FROM = 1 << 20
_INSTALL_HINT = "encryption needs the cryptography package: pip install 'arrowstash[encrypt]'"


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return AESGCM


KeySpec = str | bytes | Sequence[str | bytes]


def keyring_for(encrypt: bool | None, encryption_key: KeySpec | None, required: bool,
                backend: Any) -> Keyring | None:
    """The keys a cached function encrypts with, or None when it does not encrypt.

    ``encrypt=None`` follows the backend (``required``: its ``encrypt=True`` makes every function
    using it encrypt; ``backend`` only names it in errors) and turns on where
    ``encryption_key=`` is given; a function cannot opt out of a backend's encryption. Missing
    and malformed keys fail here, when the decorator is applied.
    """
    if encrypt is None:
        encrypt = required or encryption_key is not None
    elif not encrypt:
        if required:
            raise ValueError(f"backend {backend!r} encrypts every entry; encrypt=False cannot "
                             "turn that off")
        if encryption_key is not None:
            raise ValueError("encryption_key= is given but encrypt=False")
    if not encrypt:
        return None
    return Keyring.build(encryption_key, config.encryption_keys())


def parse_key(value: str | bytes, where: str) -> bytes:
    """A 32-byte key from raw bytes or base64 text; errors name ``where``, never the value."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) != 32:
            raise ValueError(f"{where}: an AES-256 key is 32 raw bytes, not {len(raw)}")
        return raw
    if not isinstance(value, str):
        kind = type(value).__qualname__
        raise TypeError(f"{where}: a key is base64 text or 32 bytes, not {kind}")
    text = value.strip()
    try:
        raw = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: the key is not valid base64 (expected 32 bytes, "
                         "base64-encoded: see docs/encryption.md)") from None
    if len(raw) != 32:
        raise ValueError(f"{where}: the key decodes to {len(raw)} bytes; AES-256 needs 32")
    return raw


def key_id(key: bytes) -> bytes:
    """A short public name for a key: a hash of it, which reveals nothing about it."""
    return hashlib.blake2b(key, digest_size=8, person=b"arrowstash-kid").digest()


class Keyring:
    """The key that encrypts new entries, and older keys that still decrypt theirs.

    Keys are held only inside cipher objects; the repr, errors and logs name keys by their id.
    """

    __slots__ = ("_ciphers", "_invalid", "key_id")

    def __init__(self, current: bytes, previous: Sequence[bytes] = ()) -> None:
        aesgcm = _aesgcm()
        from cryptography.exceptions import InvalidTag

        self._invalid = InvalidTag
        self.key_id = key_id(current)
        self._ciphers: dict[bytes, Any] = {}
        for key in (*reversed(previous), current):  # the current key wins a (2^-64) id clash
            self._ciphers[key_id(key)] = aesgcm(key)

    def __repr__(self) -> str:
        return f"<Keyring key id {self.key_id.hex()} (+{len(self._ciphers) - 1} older)>"

    def __reduce__(self) -> Any:
        raise TypeError("a Keyring holds secret keys and is not picklable")

    @classmethod
    def build(cls, spec: KeySpec | None,
              environment: tuple[str | None, list[str]]) -> Keyring:
        """From ``encryption_key=`` (one key, or a list: the first encrypts, all decrypt), else
        from ``environment`` (ARROWSTASH_KEY and ARROWSTASH_PREVIOUS_KEYS, as config reads
        them)."""
        if spec is None:
            current, previous = environment
            if not current:
                raise ValueError(
                    "encrypt=True needs a key: set ARROWSTASH_KEY to a base64-encoded 32-byte key "
                    "(base64.b64encode(os.urandom(32)) makes one) or pass encryption_key="
                )
            return cls(parse_key(current, "ARROWSTASH_KEY"), [
                parse_key(k, f"ARROWSTASH_PREVIOUS_KEYS (key {i + 1})")
                for i, k in enumerate(previous)
            ])
        if isinstance(spec, (str, bytes)):
            return cls(parse_key(spec, "encryption_key"))
        keys = [parse_key(k, f"encryption_key[{i}]") for i, k in enumerate(spec)]
        if not keys:
            raise ValueError("encryption_key: an empty list holds no key to encrypt with")
        return cls(keys[0], keys[1:])

    def sealer(self, bound: bytes) -> Sealer:
        """What writes the sections of one entry whose identity is ``bound``."""
        return Sealer(self._ciphers[self.key_id], self.key_id, bound)

    def open_sections(self, kid: Any, bound: bytes,
                      sections: Sequence[memoryview]) -> list[memoryview]:
        """Decrypt every section of an entry sealed under key ``kid``; CorruptEntryError if any
        chunk fails to authenticate."""
        cipher = self._ciphers.get(kid) if type(kid) is bytes else None
        if cipher is None:
            shown = kid.hex() if type(kid) is bytes else "?"
            raise CorruptEntryError(
                f"entry is encrypted with key id {shown}, which is not among this process's keys "
                "(ARROWSTASH_KEY, ARROWSTASH_PREVIOUS_KEYS or encryption_key=)"
            )
        prefix = _CONTEXT + kid + bound
        try:
            return [_open_section(cipher, prefix, index, section)
                    for index, section in enumerate(sections)]
        except self._invalid:
            raise CorruptEntryError(
                "an encrypted section fails authentication (tampered, truncated, reordered, or "
                "sealed for another entry)"
            ) from None


class Sealer:
    """Seals the sections of one entry; ``section`` gives a write-only file for each."""

    __slots__ = ("_cipher", "_prefix", "key_id")

    def __init__(self, cipher: Any, kid: bytes, bound: bytes) -> None:
        self._cipher = cipher
        self.key_id = kid
        self._prefix = _CONTEXT + kid + bound

    def section(self, index: int, emit: Callable[[Any], Any]) -> SealedSection:
        return SealedSection(self._cipher, self._prefix, index, emit)


class SealedSection:
    """A write-only file that encrypts what it is given into chunks passed to ``emit``.

    Large writes are sealed straight from the caller's buffer in CHUNK slices; small ones are
    gathered first, so that a stream of small writes does not pay a chunk per write. What is
    gathered when the section ends becomes its last chunk (empty if nothing is left).
    """

    closed = False

    def __init__(self, cipher: Any, prefix: bytes, index: int,
                 emit: Callable[[Any], Any]) -> None:
        self._cipher = cipher
        self._prefix = prefix
        self._index = index
        self._emit = emit
        self._pending = bytearray()
        self._chunks = 0
        self._size = 0  # plaintext bytes written
        self._sealed = 0  # plaintext bytes sealed

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self._size

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")  # the cipher takes unsigned bytes only
        size = view.nbytes
        if size >= CHUNK // 2:
            self._seal_pending()
            for start in range(0, size, CHUNK):
                self._seal(view[start : start + CHUNK])
        elif size:
            self._pending += view
            if len(self._pending) >= CHUNK:
                self._seal_pending()
        self._size += size
        return size

    def finish(self) -> None:
        """Seal what is pending as the last chunk."""
        self._seal(self._pending, last=True)
        self._pending = bytearray()

    def _seal_pending(self) -> None:
        if self._pending:
            self._seal(self._pending)
            self._pending = bytearray()

    def _seal(self, plain: Any, last: bool = False) -> None:
        length = len(plain)
        nonce = os.urandom(NONCE)
        place = _PLACE.pack(self._index, self._chunks, self._sealed, length, last)
        sealed = self._cipher.encrypt(nonce, plain, self._prefix + place)
        self._emit(_FRAME.pack(length | (_LAST if last else 0)) + nonce)
        self._emit(sealed)
        self._chunks += 1
        self._sealed += length


def _allocate(size: int) -> memoryview:
    """A writable buffer owned by the result it will hold."""
    if size < _ARROW_BUFFER_FROM:
        return memoryview(bytearray(size))
    import pyarrow as pa

    return memoryview(pa.allocate_buffer(size)).cast("B")


def _open_section(cipher: Any, prefix: bytes, index: int, sealed: memoryview) -> memoryview:
    """Decrypt one section; the cipher raises InvalidTag on any chunk that fails."""
    end = sealed.nbytes
    if end >= _OVERHEAD:  # the common case of a small section, one chunk, without the loop
        (word,) = _FRAME.unpack_from(sealed, 0)
        length = word & ~_LAST
        if word >= _LAST and length + _OVERHEAD == end:
            out = _allocate(length)
            cipher.decrypt_into(sealed[_FRAME.size : _FRAME.size + NONCE],
                                sealed[_FRAME.size + NONCE :],
                                prefix + _PLACE.pack(index, 0, 0, length, True), out)
            return out
    frames = []  # (where the nonce starts, offset in the plaintext, length, last)
    position, total = 0, 0
    last = False
    while not last:
        if position + _OVERHEAD > end:
            raise CorruptEntryError(f"encrypted section {index} is truncated")
        (word,) = _FRAME.unpack_from(sealed, position)
        last, length = word >= _LAST, word & ~_LAST
        if length > _MAX_CHUNK:
            raise CorruptEntryError(f"encrypted section {index} has a chunk of {length} bytes")
        frames.append((position + _FRAME.size, total, length, last))
        position += _OVERHEAD + length
        total += length
    if position != end:
        raise CorruptEntryError(f"encrypted section {index} does not end with its last chunk")
    out = _allocate(total)
    for chunk, (at, offset, length, last) in enumerate(frames):
        cipher.decrypt_into(sealed[at : at + NONCE], sealed[at + NONCE : at + NONCE + length + TAG],
                            prefix + _PLACE.pack(index, chunk, offset, length, last),
                            out[offset : offset + length])
    return out
