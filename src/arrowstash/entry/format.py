"""The entry format: the same self-describing bytes in every backend (see docs/format.md).

An entry is a fixed 64-byte header, then sections (each starting on a 64-byte boundary), then a
MessagePack trailer that describes them. The trailer sits at the end so an entry can be streamed
into its destination section by section; the header is patched once the sizes are known.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgpack
import xxhash

import arrowstash.entry.mac as macs
from arrowstash.errors import CorruptEntryError

if TYPE_CHECKING:
    from arrowstash.entry.crypto import Keyring, Sealer

MAGIC = b"\x89AST\r\n\x1a\n"
FORMAT_VERSION = 1
ALIGN = 64
HEADER = struct.Struct("<8sHHIQQddQQ")
assert HEADER.size == ALIGN
_CHECKSUM_AT = 48  # byte offset of the checksum field inside the header

FLAG_COMPRESSED = 1
FLAG_ENCRYPTED = 2
FLAG_SIGNED = 4

_PAD = bytes(ALIGN)
#: Buffers at least this large are hashed in a helper thread while they are written.
_HASH_ASIDE = 4 << 20
_MAC_CONTEXT = b"arrowstash entry v1\0"
_xxh3 = xxhash.xxh3_64_intdigest


class Sink(Protocol):
    """Where an entry's bytes go: a temporary file, a bytearray for a wire backend."""

    def write(self, data: Any, /) -> Any: ...

    def patch(self, offset: int, data: bytes) -> None:
        """Overwrite bytes already written (only the header is ever patched)."""


#: A section the serializer writes itself, piece by piece, into a file-like object, so that a
#: large payload is never materialised in memory.
StreamedSection = Callable[[Any], None]


class Key(NamedTuple):
    """Where an entry lives: the namespace and function it belongs to, and its argument digest."""

    namespace: str
    function: str
    digest: bytes

    @property
    def hex(self) -> str:
        return self.digest.hex()


@dataclass(slots=True)
class Encoded:
    """What a serializer produces: a small metadata object and the sections holding the data."""

    serializer: str
    meta: Any
    sections: list[Any] = field(default_factory=list)  # buffers or StreamedSection callables
    flags: int = 0
    #: A secret to sign the entry with (see entry.mac: a MAC of every section, and a tag over
    #: header and trailer).
    sign_with: bytes | None = None
    #: Keys to encrypt the entry with (AES-256-GCM, see entry.crypto); metadata other than
    #: None then travels encrypted as section 0 instead of in the trailer.
    encrypt_with: Keyring | None = None

    @property
    def in_memory(self) -> bool:
        return not any(callable(s) for s in self.sections)

    def buffered_size(self) -> int:
        return sum(memoryview(s).nbytes for s in self.sections if not callable(s))


class Header(NamedTuple):
    flags: int
    sections: int
    total: int
    trailer_at: int
    created: float
    expires: float  # 0.0 means never

    def expired(self, now: float) -> bool:
        return 0.0 < self.expires <= now


class Trailer(NamedTuple):
    key: Key
    serializer: str
    meta: Any
    sections: list[list[Any]]  # offset, length, xxh3-64 (None: not hashed)
    tag: bytes | None  # HMAC-SHA256 of a signed entry
    enc: dict[str, Any] | None = None  # how an encrypted entry was sealed: {"kid": key id}
    #: the keyed MAC of each section (entries signed since format v1.1; see entry.mac); None
    #: with a tag: a first-release signature (an HMAC over identity and section bytes)
    smac: list[bytes] | None = None


class Entry(NamedTuple):
    """A parsed entry; ``sections`` are views into the buffer it was read from (no copies)."""

    header: Header
    key: Key
    serializer: str
    meta: Any
    sections: list[memoryview]
    trailer: Trailer


class _SectionStream:
    """A write-only file object over the current section, handed to streaming serializers."""

    closed = False

    def __init__(self, writer: _EntryWriter) -> None:
        self._writer = writer

    def write(self, data: Any) -> int:
        return self._writer.write_raw(data)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self._writer.section_size()


def _signer(secret: bytes, key: Key, serializer: str, created: float, expires: float) -> Any:
    """The HMAC of an entry, fed its identity first; sections follow, each with its length."""
    mac = hmac.new(secret, _MAC_CONTEXT, hashlib.sha256)
    mac.update(key.digest)
    mac.update(msgpack.packb([key.namespace, key.function, serializer, created, expires]))
    return mac


class _EntryWriter:
    def __init__(self, sink: Sink, mac_key: bytes | None, hashing: bool) -> None:
        self._sink = sink
        sink.write(_PAD)  # room for the header, patched when the sizes are known
        self._offset = ALIGN
        self._section_start = ALIGN
        self._hasher = xxhash.xxh3_64()
        self._mac_key = mac_key
        self._mac: Any = None  # the running MAC of the current section
        self.section_macs: list[bytes] = []
        # Every section gets a digest (xxh3 costs a 30th of a copy, and large buffers are hashed
        # on the other core): a flipped bit in a mapped entry is found by verify=True.
        self._hashing = hashing

    def tell(self) -> int:
        return self._offset

    def write_raw(self, data: Any) -> int:
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if not self._hashing and self._mac is None:
            self._sink.write(view)
        elif view.nbytes >= _HASH_ASIDE:
            # xxhash and hmac release the GIL: hash on the other core while the sink copies the
            # bytes out (a write to the page cache costs about as much as the hash).
            hashing = threading.Thread(target=self._digest, args=(view,), name="arrowstash-hash")
            hashing.start()
            try:
                self._sink.write(view)
            finally:
                hashing.join()
        else:
            self._sink.write(view)
            self._digest(view)
        self._offset += view.nbytes
        return view.nbytes

    def _digest(self, view: memoryview) -> None:
        if self._hashing:
            self._hasher.update(view)
        if self._mac is not None:
            self._mac.update(view)

    def section_size(self) -> int:
        return self._offset - self._section_start

    def pad(self) -> None:
        gap = -self._offset % ALIGN
        if gap:
            self._sink.write(_PAD[:gap])
            self._offset += gap

    def section(self, source: Any, sealer: Sealer | None = None, index: int = 0) -> list[Any]:
        self.pad()
        self._section_start = self._offset
        self._hasher.reset()
        if self._mac_key is not None:
            self._mac = macs.section_mac(self._mac_key, index)
        if sealer is not None:
            sealed = sealer.section(index, self.write_raw)
            if callable(source):
                source(sealed)
            else:
                sealed.write(source)
            sealed.finish()
        elif callable(source):
            source(_SectionStream(self))
        else:
            self.write_raw(source)
        length = self._offset - self._section_start
        if self._mac is not None:
            self.section_macs.append(macs.finish(self._mac))
        return [self._section_start, length, self._hasher.intdigest() if self._hashing else None]


def write_entry(
    sink: Sink, key: Key, encoded: Encoded, *, created: float, expires: float | None
) -> int:
    """Write ``encoded`` as one entry into ``sink``; return its total size in bytes."""
    expires = expires or 0.0
    flags = encoded.flags
    sections, meta, sealer = encoded.sections, encoded.meta, None
    keyring = encoded.encrypt_with
    has_meta = meta is not None
    if keyring is not None:
        flags |= FLAG_ENCRYPTED
        if has_meta:
            sections = [msgpack.packb(meta, use_bin_type=True), *sections]
            meta = None
        sealer = keyring.sealer(
            _identity(key, encoded.serializer, flags, created, expires, len(sections), has_meta)
        )
    secret = encoded.sign_with if sealer is None else None  # encryption authenticates already
    mac_key = macs.derive(secret) if secret else None
    writer = _EntryWriter(sink, mac_key, hashing=sealer is None)  # GCM tags check sealed bytes
    table = [writer.section(s, sealer, i) for i, s in enumerate(sections)]
    fields = {
        "key": key.digest,
        "ns": key.namespace,
        "fn": key.function,
        "ser": encoded.serializer,
        "meta": meta,
        "sec": table,
    }
    if sealer is not None:
        fields["enc"] = {"kid": sealer.key_id, "meta": has_meta}
    if mac_key is not None:
        flags |= FLAG_SIGNED
        fields["smac"] = writer.section_macs
        fields["tag"] = bytes(macs.TAG)  # the last field: its bytes are set below
    trailer = msgpack.packb(fields, use_bin_type=True)
    writer.pad()
    trailer_at = writer.tell()
    total = trailer_at + len(trailer)
    header = _pack_header(flags, len(table), total, trailer_at, created, expires, checksum=0)
    if mac_key is not None:
        body = trailer[: -macs.TAIL]
        assert trailer[-macs.TAIL : -macs.TAG] == macs.TAG_PREFIX
        trailer = body + macs.TAG_PREFIX + macs.tag(mac_key, header, body)
    sink.write(trailer)
    checksum = _checksum(header, trailer)
    sink.patch(0, header[:_CHECKSUM_AT] + struct.pack("<Q", checksum) + header[_CHECKSUM_AT + 8 :])
    return total


def _identity(key: Key, serializer: str, flags: int, created: float, expires: float,
              count: int, has_meta: bool) -> bytes:
    """What an encrypted entry's every chunk is bound to (its associated data)."""
    packed: bytes = msgpack.packb(
        [key.namespace, key.function, key.digest, serializer, flags, created, expires, count,
         has_meta],
        use_bin_type=True,
    )
    return packed


def open_encrypted(entry: Entry, keyring: Keyring) -> Entry:
    """``entry`` with its sections decrypted (into buffers of its own) and its metadata restored;
    CorruptEntryError if it does not authenticate."""
    header, trailer = entry.header, entry.trailer
    assert trailer.enc is not None
    if entry.meta is not None:
        raise CorruptEntryError("encrypted entry with plaintext metadata in its trailer")
    has_meta = trailer.enc.get("meta")
    if type(has_meta) is not bool:
        raise CorruptEntryError("encrypted entry does not say whether it holds metadata")
    identity = _identity(entry.key, entry.serializer, header.flags, header.created,
                         header.expires, header.sections, has_meta)
    opened = keyring.open_sections(trailer.enc.get("kid"), identity, entry.sections)
    if not has_meta:
        return entry._replace(sections=opened)
    if not opened:
        raise CorruptEntryError("encrypted entry has no metadata section")
    try:
        meta = msgpack.unpackb(opened[0], raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptEntryError(f"unreadable encrypted metadata: {exc}") from exc
    return entry._replace(meta=meta, sections=opened[1:])


def _pack_header(
    flags: int, count: int, total: int, trailer_at: int, created: float, expires: float,
    checksum: int,
) -> bytes:
    return HEADER.pack(
        MAGIC, FORMAT_VERSION, flags, count, total, trailer_at, created, expires, checksum, 0
    )


def _checksum(header: bytes | memoryview, trailer: bytes | memoryview) -> int:
    h = xxhash.xxh3_64()
    h.update(header[:_CHECKSUM_AT])
    h.update(header[_CHECKSUM_AT + 8 : ALIGN])
    h.update(trailer)
    return h.intdigest()


class BytesSink:
    """Collects an entry in one buffer, for backends that store whole values."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def write(self, data: Any) -> None:
        self.buffer += data

    def patch(self, offset: int, data: bytes) -> None:
        self.buffer[offset : offset + len(data)] = data


def entry_bytes(key: Key, encoded: Encoded, *, created: float, expires: float | None) -> bytearray:
    sink = BytesSink()
    write_entry(sink, key, encoded, created=created, expires=expires)
    return sink.buffer


def signature_valid(entry: Entry, secret: bytes) -> bool:
    """Whether ``entry`` carries a valid first-release HMAC for ``secret`` (reads every section
    byte; it does not cover the metadata)."""
    tag = entry.trailer.tag
    if tag is None:
        return False
    header = entry.header
    mac = _signer(secret, entry.key, entry.serializer, header.created, header.expires)
    for section in entry.sections:
        mac.update(section)
        mac.update(struct.pack("<Q", section.nbytes))
    return hmac.compare_digest(mac.digest(), tag)


@dataclass(frozen=True, slots=True)
class EntryWriter:
    """An entry ready to be stored: what a backend's ``set`` receives. The backend chooses how
    the bytes travel (streamed into a sink, or collected in one buffer) and never assembles or
    parses an entry itself."""

    key: Key
    encoded: Encoded
    created: float
    expires: float | None  # None: never

    def write(self, sink: Sink) -> int:
        """Stream the entry into ``sink`` section by section; return its size in bytes."""
        return write_entry(sink, self.key, self.encoded, created=self.created,
                           expires=self.expires)

    def to_bytes(self) -> bytearray:
        """The whole entry in one buffer, for stores that take whole values."""
        return entry_bytes(self.key, self.encoded, created=self.created, expires=self.expires)

    @property
    def in_memory(self) -> bool:
        """No section is streamed: writing needs no serializer work, only copies."""
        return self.encoded.in_memory

    def planned_size(self) -> int:
        """The size of the entry's header and in-memory sections, aligned: a lower bound of its
        size, known before writing (to reserve disk space, say)."""
        return ALIGN + sum(-(-memoryview(s).nbytes // ALIGN) * ALIGN
                           for s in self.encoded.sections if not callable(s))


def manifest_ends(data: Any) -> tuple[bytes, bytes]:
    """The header and the trailer of the entry in ``data``: what a listing needs, kept apart by
    stores that split a large entry into chunks."""
    view = memoryview(data)
    header = read_header(view)
    return view[:ALIGN].tobytes(), view[header.trailer_at :].tobytes()


def materialize(encoded: Encoded) -> Encoded:
    """``encoded`` with its streamed sections run into memory."""
    if encoded.in_memory:
        return encoded
    sections = []
    for section in encoded.sections:
        if callable(section):
            out = io.BytesIO()
            section(out)
            section = out.getbuffer()
        sections.append(section)
    return Encoded(encoded.serializer, encoded.meta, sections, encoded.flags, encoded.sign_with,
                   encoded.encrypt_with)


def read_header(buffer: Any, size: int | None = None) -> Header:
    """Parse and sanity-check the fixed header of an entry of ``size`` bytes (by default the
    buffer's length); raise CorruptEntryError if it is not ours."""
    view = memoryview(buffer)
    size = view.nbytes if size is None else size
    if view.nbytes < ALIGN:
        raise CorruptEntryError(f"entry is {view.nbytes} bytes, shorter than its header")
    magic, version, flags, count, total, trailer_at, created, expires, _, _ = HEADER.unpack_from(
        view
    )
    if magic != MAGIC:
        raise CorruptEntryError("not an arrowstash entry (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptEntryError(
            f"entry format version {version} is not supported (this arrowstash reads "
            f"version {FORMAT_VERSION}; upgrade arrowstash to read it)"
        )
    if total != size:
        raise CorruptEntryError(f"entry is truncated or padded: {size} bytes of {total}")
    if not ALIGN <= trailer_at <= total:
        raise CorruptEntryError(f"trailer offset {trailer_at} is out of bounds")
    return Header(flags, count, total, trailer_at, created, expires)


def read_trailer(header_bytes: Any, header: Header, trailer: Any) -> Trailer:
    """Check the checksum over header and trailer, then parse and bounds-check the trailer."""
    if _checksum(header_bytes, trailer) != struct.unpack_from("<Q", header_bytes, _CHECKSUM_AT)[0]:
        raise CorruptEntryError("header checksum mismatch")
    try:
        info = msgpack.unpackb(trailer, raw=False, strict_map_key=False)
        namespace, function, digest = info["ns"], info["fn"], info["key"]
        serializer, table = info["ser"], info["sec"]
        meta, tag, enc, smac = info["meta"], info.get("tag"), info.get("enc"), info.get("smac")
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptEntryError(f"unreadable trailer: {exc}") from exc
    if type(namespace) is not str or type(function) is not str or type(digest) is not bytes \
            or type(serializer) is not str or type(table) is not list \
            or (tag is not None and type(tag) is not bytes) \
            or (enc is not None and type(enc) is not dict):
        raise CorruptEntryError("trailer fields have the wrong types")
    if len(table) != header.sections:
        raise CorruptEntryError("section table does not match the header")
    end = header.trailer_at
    for index, row in enumerate(table):
        if type(row) is not list or len(row) != 3 or type(row[0]) is not int \
                or type(row[1]) is not int or (type(row[2]) is not int and row[2] is not None):
            raise CorruptEntryError(f"section {index} is described wrongly")
        offset, length = row[0], row[1]
        if offset % ALIGN or offset < ALIGN or length < 0 or offset + length > end:
            raise CorruptEntryError(f"section {index} lies outside the entry")
    if (tag is not None) != bool(header.flags & FLAG_SIGNED):
        raise CorruptEntryError("signature flag and tag disagree")
    if smac is not None and (tag is None or type(smac) is not list or len(smac) != len(table)
                             or any(type(m) is not bytes or len(m) != macs.SECTION_MAC
                                    for m in smac)):
        raise CorruptEntryError("section MACs are described wrongly")
    if (enc is not None) != bool(header.flags & FLAG_ENCRYPTED):
        raise CorruptEntryError("encryption flag and trailer disagree")
    return Trailer(Key(namespace, function, digest), serializer, meta, table, tag, enc, smac)


def parse_entry(
    buffer: Any, *, check_sections: bool = True, known: Entry | None = None,
    secret: bytes | None = None,
) -> Entry:
    """Validate ``buffer`` and return the entry it holds, its sections as views into it.

    ``check_sections=False`` skips hashing the section data (header, trailer and bounds are always
    checked); the File backend uses it for memory-mapped reads, where hashing would read every page
    of a value that was written atomically and may never be touched in full.

    ``known`` is an earlier parse of the same stored entry (same header bytes and size): its header
    and trailer are reused, and only the sections are checked against it.

    With ``secret``, an entry that is not encrypted must be signed with it (see entry.mac): its
    tag is checked, and its sections' MACs where sections are checked; an unsigned entry, or
    one signed with another secret, is a CorruptEntryError.
    """
    view = buffer if type(buffer) is memoryview else memoryview(buffer)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    if known is not None and check_sections and known.header.total == view.nbytes:
        header, trailer = known.header, known.trailer
    else:
        header = read_header(view)
        trailer = read_trailer(view[:ALIGN], header, view[header.trailer_at : header.total])
    # AES-GCM authenticates every byte of an encrypted section when it is decrypted.
    encrypted = header.flags & FLAG_ENCRYPTED
    mac_key = None
    if secret is not None and not encrypted and trailer.smac is not None:
        mac_key = macs.derive(secret)
        _check_tag(mac_key, view, header)
    if check_sections and not encrypted and mac_key is None:
        # the common read, checked inline: this loop is on every hit's path
        sections: list[memoryview] = []
        for offset, length, digest in trailer.sections:
            section = view[offset : offset + length]
            if digest is not None and _xxh3(section) != digest:
                raise CorruptEntryError(f"section {len(sections)} checksum mismatch")
            sections.append(section)
    else:
        sections = _views(view, trailer.sections)
    # tuple.__new__ skips the NamedTuple's Python-level __new__
    entry: Entry = tuple.__new__(Entry, (header, trailer.key, trailer.serializer, trailer.meta,
                                         sections, trailer))
    if mac_key is not None and check_sections:
        _check_sections(entry, mac_key)
    if secret is not None and not encrypted and mac_key is None \
            and (trailer.tag is None or not signature_valid(entry, secret)):
        raise CorruptEntryError("entry carries no valid signature for this secret (a secret "
                                "requires every entry to be signed with it)")
    return entry


def _views(view: memoryview, table: list[list[Any]]) -> list[memoryview]:
    """The sections of a section table (apart: a comprehension in parse_entry would make its
    every use of the buffer a closure cell's)."""
    return [view[offset : offset + length] for offset, length, _ in table]


def verify_sections(entry: Entry, secret: bytes | None = None) -> None:
    """Check every section of a parsed entry against its digest (and its MAC, with ``secret``):
    what a mapped read skips, done where a flip must not go unseen (verify=True, a pickled
    entry, ``arrowstash verify``). CorruptEntryError names the first bad section."""
    if not entry.header.flags & FLAG_ENCRYPTED:
        signed = secret is not None and entry.trailer.smac is not None
        _check_sections(entry, macs.derive(secret) if signed else None)


def _check_sections(entry: Entry, mac_key: bytes | None) -> None:
    trailer = entry.trailer
    for index, section in enumerate(entry.sections):
        digest = trailer.sections[index][2]
        if digest is not None and xxhash.xxh3_64_intdigest(section) != digest:
            raise CorruptEntryError(f"section {index} checksum mismatch")
        if mac_key is not None:
            running = macs.section_mac(mac_key, index)
            running.update(section)
            if not macs.same(macs.finish(running), trailer.smac[index]):  # type: ignore[index]
                raise CorruptEntryError(f"section {index} fails its MAC")


def _check_tag(key: bytes, view: memoryview, header: Header) -> None:
    """The tag is the trailer's last field; it covers the header and every trailer byte
    before it (docs/format.md)."""
    trailer = view[header.trailer_at : header.total]
    body, tail = trailer[: -macs.TAIL], trailer[-macs.TAIL :]
    if tail[: len(macs.TAG_PREFIX)] != macs.TAG_PREFIX \
            or not macs.same(macs.tag(key, view[:ALIGN], body), tail[len(macs.TAG_PREFIX) :]):
        raise CorruptEntryError("entry signature does not match: forged, altered, or signed "
                                "with another secret")
