"""The embedded default: one file per entry in a folder, safe for many processes at once.

Writers stream into a temporary file and rename it into place, so a reader opens either the old
or the new entry, never a half-written one, and an open (or mapped) entry keeps its bytes after
being replaced or deleted. Nothing is ever rewritten in place.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import xxhash

from arrowstash.backends._mmap import map_private
from arrowstash.backends._urls import local_path
from arrowstash.backends.base import Capabilities, Held, Stored, take_lock
from arrowstash.entry.format import ALIGN, EntryWriter, Key
from arrowstash.entry.listing import EntryInfo, describe_file
from arrowstash.errors import BackendError, CorruptEntryError

SUFFIX = ".ast"
_TEMP_SUFFIX = ".tmp"
_STALE_TEMP_SECONDS = 3600.0
#: Entries whose in-memory sections reach this size get their disk space reserved first.
_RESERVE_FROM = 4 << 20
#: Bytes read at the first attempt: a page, which holds most small entries whole.
_FIRST_READ = 4096
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _folder_name(name: str) -> str:
    """A readable, collision-free folder name for a namespace or function."""
    safe = _SAFE.sub("_", name)[:64] or "_"
    if safe == name and not name.startswith("."):
        return name
    return f"{safe}~{xxhash.xxh3_64_hexdigest(name.encode())[:8]}"


class _FileSink:
    def __init__(self, fd: int, unhashed_from: int) -> None:
        self._fd = fd
        self.unhashed_from = unhashed_from

    def write(self, data: Any) -> None:
        view = memoryview(data)
        while view.nbytes:
            view = view[os.write(self._fd, view) :]

    def patch(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)


class FileBackend:
    """Entries as files under ``directory`` (created with mode 0700).

    ``max_bytes`` caps the folder by evicting least recently used entries; ``durable`` fsyncs
    each entry and its folder before it becomes visible. Entries of ``mmap_threshold`` bytes or
    more are read through a private memory map instead of being read in. ``encrypt=True`` makes
    every cached function using this backend encrypt its entries (docs/encryption.md).
    """

    capabilities = Capabilities(shared=False, remote=False, streams_writes=True, maps_reads=True,
                                lists_entries=True, native_ttl=False)

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int | None = None,
        durable: bool = False,
        mmap_threshold: int = 1 << 20,
        *,
        encrypt: bool = False,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, not {max_bytes!r}")
        if isinstance(directory, str):  # a path or file://, never redis://host as a folder
            directory = local_path(directory)
        self.directory = Path(directory).expanduser().absolute()
        self.max_bytes = max_bytes
        self.durable = durable
        self.mmap_threshold = max(mmap_threshold, ALIGN)
        self._first_read = min(_FIRST_READ, self.mmap_threshold)  # a full one may need a map
        self.encrypt = encrypt
        self._written_since_scan = 0
        self._known_size: int | None = None
        self._folders: dict[tuple[str, str], str] = {}
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create cache folder {self.directory}: {exc}") from exc

    def __repr__(self) -> str:
        return f"FileBackend({str(self.directory)!r}, max_bytes={self.max_bytes!r})"

    def path(self, key: Key) -> str:
        folder = self._folders.get((key.namespace, key.function))
        if folder is None:
            folder = os.path.join(
                self.directory, _folder_name(key.namespace), _folder_name(key.function)
            )
            self._folders[(key.namespace, key.function)] = folder
        name = key.digest.hex()
        return f"{folder}/{name[:2]}/{name}{SUFFIX}"

    def get(self, key: Key) -> Stored | None:
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BackendError(f"cannot open {path}: {exc}") from exc
        try:
            # Most entries are small: one read of a fixed size, and a short read gives the
            # size without an fstat. A file is never rewritten in place, so whatever size it
            # has is the size of one complete (or truncated, which parsing reports) entry.
            first = self._first_read
            data = bytearray(first)  # writable: loaded arrays may view it
            got = os.readv(fd, [data])
            if got < first:
                view = memoryview(data)[:got]
                # The header holds the checksum of header and trailer and the creation time:
                # equal header bytes and size mean the reader may reuse its parse of the trailer.
                fingerprint = bytes(view[:ALIGN]) if got >= ALIGN else None
                stored = tuple.__new__(Stored, (view, False, fingerprint))  # skips a Python call
            else:
                stored = self._read_large(fd, data)
        except OSError as exc:
            raise BackendError(f"cannot read {path}: {exc}") from exc
        finally:
            os.close(fd)
        if self.max_bytes is not None:
            with contextlib.suppress(OSError):
                os.utime(path)  # recency for LRU eviction
        return stored

    def _read_large(self, fd: int, first: bytearray) -> Stored:
        size = os.fstat(fd).st_size
        if size >= self.mmap_threshold:
            return Stored(map_private(fd, size), mapped=True)
        data = bytearray(size)
        done = len(first)
        data[:done] = first
        if size > done:
            os.preadv(fd, [memoryview(data)[done:]], done)
        return Stored(memoryview(data), False, bytes(data[:ALIGN]))

    def set(self, entry: EntryWriter) -> int:
        key = entry.key
        path = self.path(key)
        folder = os.path.dirname(path)
        temp = f"{folder}/.{key.hex}.{os.getpid()}.{secrets.token_hex(4)}{_TEMP_SUFFIX}"
        try:
            fd = self._create(temp, folder)
        except OSError as exc:
            raise BackendError(f"cannot create {temp}: {exc}") from exc
        try:
            try:
                planned = _reserve(fd, entry)
                sink = _FileSink(fd, self.mmap_threshold)
                size = entry.write(sink)
                if planned:
                    os.ftruncate(fd, size)  # in case the reservation outgrew the entry
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if isinstance(exc, OSError):
                raise BackendError(f"cannot write {path}: {exc}") from exc
            raise
        if self.durable:
            _fsync_folder(folder)
        if self.max_bytes is not None:
            self._account(size)
        return size

    def _create(self, temp: str, folder: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            return os.open(temp, flags, 0o600)
        except FileNotFoundError:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            return os.open(temp, flags, 0o600)

    def delete(self, key: Key) -> bool:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise BackendError(f"cannot delete {self.path(key)}: {exc}") from exc
        return True

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        if function is not None and namespace is None:
            raise ValueError("clear(function=...) needs the namespace too")
        root = self.directory
        if namespace is not None:
            root = root / _folder_name(namespace)
            if function is not None:
                root = root / _folder_name(function)
        removed = 0
        for path in self._files(root):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += path.endswith(SUFFIX)
        self._known_size = None
        return removed

    def _files(self, root: Path) -> Iterator[str]:
        """Entry files below ``root``, and temporary files left by writers that died."""
        stale = time.time() - _STALE_TEMP_SECONDS
        for folder, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                if name.endswith(SUFFIX):
                    yield path
                elif name.endswith(_TEMP_SUFFIX):
                    with contextlib.suppress(OSError):
                        if os.stat(path).st_mtime < stale:
                            yield path

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]:
        """Every readable entry, from its header and trailer; unreadable files are skipped."""
        root = self.directory / _folder_name(namespace) if namespace else self.directory
        for path in self._files(root):
            if not path.endswith(SUFFIX):
                continue
            try:
                yield describe_file(path)
            except (OSError, CorruptEntryError):
                continue

    def stats(self) -> dict[str, Any]:
        count = size = 0
        for path in self._files(self.directory):
            if not path.endswith(SUFFIX):
                continue
            with contextlib.suppress(FileNotFoundError):
                size += os.stat(path).st_size
                count += 1
        return {
            "backend": "file",
            "directory": str(self.directory),
            "entries": count,
            "bytes": size,
            "max_bytes": self.max_bytes,
        }

    # -- eviction ---------------------------------------------------------------------------

    def _account(self, size: int) -> None:
        self._written_since_scan += size
        assert self.max_bytes is not None
        if self._known_size is None or self._known_size + self._written_since_scan > self.max_bytes:
            self.evict()

    def evict(self) -> int:
        """Delete least recently used entries until the folder is under 90% of ``max_bytes``.

        One process evicts at a time (the others skip it); readers are unaffected because a file
        that is open or mapped keeps its bytes after unlinking.
        """
        if self.max_bytes is None:
            return 0
        with self._exclusive(".evict.lock", timeout=0.0) as held:
            if not held:
                return 0
            files = []
            for path in self._files(self.directory):
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(path)
                    files.append((st.st_mtime_ns, st.st_size, path))
            total = sum(size for _, size, _ in files)
            removed = 0
            if total > self.max_bytes:
                goal = self.max_bytes * 0.9
                for _, size, path in sorted(files):
                    if total <= goal:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        removed += 1
                    total -= size
            self._known_size = total
            self._written_since_scan = 0
            return removed

    # -- locks ------------------------------------------------------------------------------

    def lock(self, key: Key, timeout: float) -> contextlib.AbstractContextManager[Held]:
        return self._exclusive(f".locks/{key.hex}.lock", timeout)

    @contextlib.contextmanager
    def _exclusive(self, name: str, timeout: float) -> Iterator[Held]:
        """An flock-held file; the holder unlinks it before unlocking, so waiters re-check that
        the file they locked is still the one at the path."""
        path = os.path.join(self.directory, name)
        fd = -1

        def attempt() -> bool:
            nonlocal fd
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                try:
                    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                except OSError as exc:
                    raise BackendError(f"cannot create lock folder for {path}: {exc}") from exc
                return attempt()
            except OSError as exc:
                raise BackendError(f"cannot open lock file {path}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    return True
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT):
                    os.close(fd)
                    raise BackendError(f"cannot lock {path}: {exc}") from exc
            os.close(fd)
            return False

        held = take_lock(attempt, timeout)
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                os.close(fd)


def _reserve(fd: int, entry: EntryWriter) -> int:
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


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
