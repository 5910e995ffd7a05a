"""The File backend's system calls that must not be fooled: opening entries, writing temporaries,
resolving paths without following links, and telling a dead writer's temporary file from a live
one."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
from typing import Any

import xxhash

from arrowstash.backends._mmap import map_private
from arrowstash.backends.base import Stored
from arrowstash.entry.format import ALIGN, HEADER, EntryWriter

#: Folder (under the cache root) of the temporary files writers stream entries into.
TEMP_FOLDER = ".writing"
TEMP_SUFFIX = ".tmp"
#: A temporary file older than this is a leftover whatever its name says (its writer may run on
#: another machine sharing the folder, or its pid may have been reused).
STALE_TEMP_SECONDS = 3600.0
#: Entries whose in-memory sections reach this size get their disk space reserved first.
_RESERVE_FROM = 4 << 20
#: Opening an entry never blocks (a FIFO planted in its place) nor follows a link.
ENTRY_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: What ``get`` returns for something that is not an entry file: parsing it is a logged miss.
NOT_AN_ENTRY = Stored(memoryview(b""))
_HOST = xxhash.xxh3_64_hexdigest(socket.gethostname().encode())[:8]


def read_large(fd: int, first: bytes, mmap_threshold: int) -> Stored:
    """The rest of an entry whose first read filled ``first``; only a regular file is read on
    (a device such as /dev/zero in an entry's place would never end)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return NOT_AN_ENTRY
    size = st.st_size
    if HEADER.unpack_from(first)[4] != size:
        # Not the size its header declares: damaged, or a sparse file of a terabyte that must
        # not be mapped or read. Parsing the bytes read so far reports it (truncated or padded).
        return Stored(memoryview(bytearray(first)), False, None)
    if size >= mmap_threshold:
        return Stored(map_private(fd, size), mapped=True)
    data = bytearray(size)
    done = min(len(first), size)
    data[:done] = first[:done]
    if size > done:
        os.preadv(fd, [memoryview(data)[done:]], done)
    return Stored(memoryview(data), False, bytes(data[:ALIGN]))


def folder_beneath(root: str, parts: list[str], create: bool) -> int:
    """A descriptor of ``root/parts...`` reached without following any link (``create``:
    making missing folders, mode 0700). For folders others may write to, where a folder could
    be swapped for a link between two calls."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_temp(root: str) -> tuple[str, int]:
    """A fresh temporary file (mode 0600) in the root's temporary folder, named after this
    process so that others can tell when it has been left behind."""
    folder = os.path.join(root, TEMP_FOLDER)
    name = f"{folder}/{_HOST}-{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return name, os.open(name, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return name, os.open(name, flags, 0o600)


def is_orphan(name: str, mtime: float, now: float) -> bool:
    """Whether the temporary file ``name`` (a base name) was left by a writer that is gone:
    a process of this machine that no longer exists, or any writer past the age bound."""
    if mtime < now - STALE_TEMP_SECONDS:
        return True
    host, _, rest = name.partition("-")
    pid_text = rest.partition("-")[0]
    if host != _HOST or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


class FileSink:
    """Where an :class:`EntryWriter` streams an entry: the temporary file's descriptor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: Any) -> None:
        view = memoryview(data)
        while view.nbytes:
            view = view[os.write(self._fd, view) :]

    def patch(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)


def write_temp(fd: int, entry: EntryWriter, durable: bool) -> int:
    """Stream ``entry`` into the temporary file ``fd``; its size."""
    planned = reserve(fd, entry)
    size = entry.write(FileSink(fd))
    if planned:
        os.ftruncate(fd, size)  # the reservation may have outgrown the entry (a temporary file)
    if durable:
        os.fsync(fd)
    return size


def reserve(fd: int, entry: EntryWriter) -> int:
    """Allocate the disk blocks of a large entry before writing it (as np.save does): the
    filesystem then allocates extents once instead of page by page, which makes writing a large
    array markedly faster. Returns the bytes reserved (0: none)."""
    planned = entry.planned_size()
    if planned < _RESERVE_FROM or not hasattr(os, "posix_fallocate"):
        return 0
    try:
        os.posix_fallocate(fd, 0, planned)
    except OSError:  # not supported by this filesystem: write without it
        return 0
    return planned


def fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def regular_size(path: str) -> int:
    """The size of the regular file at ``path`` (not following a link), 0 if there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0
