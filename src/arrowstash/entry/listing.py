"""What ``arrowstash ls`` shows of stored entries, read from their header and trailer alone
(listings never read the data)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from arrowstash.entry.format import ALIGN, read_header, read_trailer


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What ``arrowstash ls`` shows of one entry."""

    namespace: str
    function: str
    key: str
    serializer: str
    size: int
    created: float
    expires: float  # 0.0 means never
    location: str


def describe(header_bytes: Any, trailer_bytes: Any, size: int, location: str) -> EntryInfo:
    """Summarise a stored entry from its header and trailer alone (listings never read data);
    raises CorruptEntryError if they are not valid."""
    header = read_header(header_bytes, size)
    trailer = read_trailer(header_bytes, header, trailer_bytes)
    return EntryInfo(
        trailer.key.namespace,
        trailer.key.function,
        trailer.key.hex,
        trailer.serializer,
        header.total,
        header.created,
        header.expires,
        location,
    )


def describe_buffer(data: Any, location: str) -> EntryInfo:
    view = memoryview(data)
    header = read_header(view)
    return describe(view[:ALIGN], view[header.trailer_at :], view.nbytes, location)


def describe_file(path: str) -> EntryInfo:
    """The entry stored in the file at ``path``; OSError or CorruptEntryError if unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        header = os.pread(fd, ALIGN, 0)
        trailer_at = read_header(header, size).trailer_at
        return describe(header, os.pread(fd, size - trailer_at, trailer_at), size, path)
    finally:
        os.close(fd)


def trailer_offset(header_bytes: Any, size: int) -> int:
    """Where the trailer of an entry of ``size`` bytes starts, from its header alone (stores
    that can read a range fetch just the trailer for a listing)."""
    return read_header(header_bytes, size).trailer_at
