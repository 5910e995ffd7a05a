"""The embedded default: one file per entry in a folder, safe for many processes at once.

Writers stream into a temporary file and rename it into place, so a reader opens either the old
or the new entry, never a half-written one, and an open (or mapped) entry keeps its bytes after
being replaced or deleted. Nothing is ever rewritten in place.

The folder is trusted only when this user alone can write it (``_file_trust``); the temporary
files, the shared size ledger and the safe system calls live in ``_file_io`` and ``_file_space``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import xxhash

from arrowstash import config
from arrowstash.backends._file_io import (
    ENTRY_FLAGS,
    NOT_AN_ENTRY,
    TEMP_FOLDER,
    folder_beneath,
    fsync_folder,
    new_temp,
    read_large,
    regular_size,
    write_temp,
)
from arrowstash.backends._file_space import (
    LEDGER_WAIT,
    LOCKS_FOLDER,
    SUFFIX,
    Ledger,
    logger,
    scan,
)
from arrowstash.backends._file_trust import FolderGuard
from arrowstash.backends._urls import local_path
from arrowstash.backends.base import Capabilities, Held, Stored, take_lock
from arrowstash.entry.format import ALIGN, EntryWriter, Key
from arrowstash.entry.listing import EntryInfo, describe_file
from arrowstash.errors import BackendError, CorruptEntryError

#: Bytes read at the first attempt: a page, which holds most small entries whole.
_FIRST_READ = 4096
#: Paths of this many recent keys are kept (about 200 bytes each).
_PATHS_KEPT = 1024
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _folder_name(name: str) -> str:
    """A readable, collision-free folder name for a namespace or function."""
    safe = _SAFE.sub("_", name)[:64] or "_"
    if safe == name and not name.startswith("."):
        return name
    return f"{safe}~{xxhash.xxh3_64_hexdigest(name.encode())[:8]}"


class FileBackend:
    """Entries as files under ``directory`` (created with mode 0700).

    ``max_bytes`` caps the folder, shared by every process writing to it, by evicting least
    recently used entries; ``durable`` fsyncs each entry and its folder before it becomes
    visible. Entries of ``mmap_threshold`` bytes or more are read through a private memory map
    instead of being read in. ``encrypt=True`` makes every cached function using this backend
    encrypt its entries (docs/encryption.md). A folder that others can write to is refused
    unless a secret is set or ``shared=True`` says it is shared on purpose; it is then treated
    as a shared store (docs/security.md).
    """

    capabilities = Capabilities(shared=False, remote=False, streams_writes=True, maps_reads=True,
                                lists_entries=True, native_ttl=False, checks_owner=True)

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int | None = None,
        durable: bool = False,
        mmap_threshold: int = 1 << 20,
        *,
        encrypt: bool = False,
        shared: bool = False,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, not {max_bytes!r}")
        if isinstance(directory, str):  # a path or file://, never redis://host as a folder
            directory = local_path(directory)
        self.directory = Path(directory).expanduser().absolute()
        self._root = root = str(self.directory)
        self.max_bytes = max_bytes
        self.durable = durable
        self.mmap_threshold = max(mmap_threshold, ALIGN)
        self._first_read = min(_FIRST_READ, self.mmap_threshold)  # a full one may need a map
        self.encrypt = encrypt
        self._folders: dict[tuple[str, str], str] = {}
        self._paths: dict[Key, str] = {}  # the paths of recent keys
        self._ledger = Ledger(root, max_bytes) if max_bytes is not None else None
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._guard = FolderGuard(root, tolerate=shared or config.secret() is not None)
        except OSError as exc:
            raise BackendError(f"cannot create cache folder {self.directory}: {exc}") from exc
        #: Resolve every path without following links: others may swap folders for links.
        self._beneath = False
        if shared or not self._guard.trusted:
            self._share()

    def __repr__(self) -> str:
        return f"FileBackend({str(self.directory)!r}, max_bytes={self.max_bytes!r})"

    def _share(self) -> None:
        """Treat the folder as shared: entries that run code need a secret (the pipeline reads
        this instance's ``capabilities.shared``), and no path component is trusted."""
        self.capabilities = dataclasses.replace(type(self).capabilities, shared=True)
        self._beneath = True

    def path(self, key: Key) -> str:
        path = self._paths.get(key)  # a hit's key is usually a recent one: one dict lookup
        if path is None:
            folder = self._folders.get((key.namespace, key.function))
            if folder is None:
                folder = self._resolve(key.namespace, key.function)
            name = key.digest.hex()
            path = f"{folder}/{name[:2]}/{name}{SUFFIX}"
            if len(self._paths) >= _PATHS_KEPT:
                self._paths.clear()
            self._paths[key] = path
        return path

    def _resolve(self, namespace: str, function: str) -> str:
        """The function's folder, checked with its namespace's and its own subfolders (once)."""
        outer = os.path.join(self._root, _folder_name(namespace))
        folder = os.path.join(outer, _folder_name(function))
        self._guard.check(outer, children=False)
        self._guard.check(folder, children=True)
        if not self._guard.trusted and not self._beneath:
            self._share()
        self._folders[(namespace, function)] = folder
        return folder

    def _parts(self, path: str) -> tuple[list[str], str]:
        """The folders of ``path`` below the root, and its file name."""
        *folders, name = os.path.relpath(path, self._root).split(os.sep)
        return folders, name

    def _open_beneath(self, path: str) -> int:
        """Open an entry of a shared folder without following a link anywhere on its path."""
        folders, name = self._parts(path)
        fd = folder_beneath(self._root, folders, create=False)
        try:
            return os.open(name, ENTRY_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)

    def get(self, key: Key) -> Stored | None:
        path = self.path(key)
        try:
            fd = self._open_beneath(path) if self._beneath else os.open(path, ENTRY_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in _NOT_AN_ENTRY:  # a link, socket, FIFO... planted in its place
                return NOT_AN_ENTRY
            raise BackendError(f"cannot open {path}: {exc}") from exc
        try:
            # Most entries are small: one read of a fixed size, and a short read gives the
            # size without an fstat. A file is never rewritten in place, so whatever size it
            # has is the size of one complete (or truncated, which parsing reports) entry. A
            # short read cannot hang (O_NONBLOCK); a full one is only read on from a regular file.
            first = self._first_read
            raw = os.read(fd, first)
            got = len(raw)
            if got < first:
                # The header holds the checksum of header and trailer and the creation time:
                # equal header bytes and size mean the reader may reuse its parse of the trailer.
                fingerprint = raw[:ALIGN] if got >= ALIGN else None
                # a writable copy (loaded arrays may view it): cheaper than reading into a
                # zeroed page-sized bytearray
                stored = tuple.__new__(Stored, (memoryview(bytearray(raw)), False, fingerprint))
            else:
                stored = read_large(fd, raw, self.mmap_threshold)
            if self.max_bytes is not None:
                with contextlib.suppress(OSError):
                    os.utime(fd)  # recency for LRU eviction
        except OSError as exc:
            if exc.errno in _NOT_AN_ENTRY:
                return NOT_AN_ENTRY
            raise BackendError(f"cannot read {path}: {exc}") from exc
        finally:
            os.close(fd)
        return stored

    def set(self, entry: EntryWriter) -> int:
        path = self.path(entry.key)
        try:
            temp, fd = new_temp(self._root)
        except OSError as exc:
            raise BackendError(f"cannot create a temporary file in {self._root}: {exc}") from exc
        try:
            try:
                size = write_temp(fd, entry, self.durable)
            finally:
                os.close(fd)
            if self._ledger is None:
                self._place(temp, path)
            else:
                self._place_counted(temp, path, size)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if isinstance(exc, OSError):
                raise BackendError(f"cannot write {path}: {exc}") from exc
            raise
        if self.durable:
            fsync_folder(os.path.dirname(path))
        return size

    def _place(self, temp: str, path: str) -> None:
        """Rename the written temporary file to ``path``, making missing folders (0700)."""
        if self._beneath:
            folders, name = self._parts(path)
            fd = folder_beneath(self._root, folders, create=True)
            try:
                os.replace(temp, name, dst_dir_fd=fd)
            finally:
                os.close(fd)
            return
        try:
            os.replace(temp, path)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            os.replace(temp, path)

    def _place_counted(self, temp: str, path: str, size: int) -> None:
        """Place the entry and account for it in the shared ledger, evicting past the cap,
        all under the ledger's lock so that no two writers count on the same total."""
        assert self._ledger is not None
        with self._ledger.held(LEDGER_WAIT) as ledger:
            replaced = regular_size(path)
            self._place(temp, path)
            if ledger is None:  # busy too long: leave the total to the next writer's scan
                logger.warning("size ledger of %s busy for %g s; it will be recounted",
                               self._root, LEDGER_WAIT)
                self._ledger.forget()
                return
            try:
                self._ledger.add(ledger, size - replaced)
            except OSError as exc:  # the entry is stored; only its accounting failed
                logger.warning("cannot update the size ledger of %s: %s", self._root, exc)
                self._ledger.forget()

    def delete(self, key: Key) -> bool:
        path = self.path(key)
        try:
            if self._beneath:
                folders, name = self._parts(path)
                fd = folder_beneath(self._root, folders, create=False)
                try:
                    os.unlink(name, dir_fd=fd)
                finally:
                    os.close(fd)
            else:
                os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in _NOT_AN_ENTRY:  # a folder or link where the entry belongs
                logger.warning("cannot delete %s, which is not an entry: %s", path, exc)
                return False
            raise BackendError(f"cannot delete {path}: {exc}") from exc
        return True

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        """Delete entries (and dead writers' temporary files). Takes no lock: never waits."""
        if function is not None and namespace is None:
            raise ValueError("clear(function=...) needs the namespace too")
        root = self._root
        if namespace is not None:
            root = os.path.join(root, _folder_name(namespace))
            if function is not None:
                root = os.path.join(root, _folder_name(function))
        removed = 0
        for path in self._entry_files(root):
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                logger.warning("cannot delete %s: %s", path, exc)
        scan(self._root, entries=False)  # removes what dead writers left
        if self._ledger is not None:
            self._ledger.forget()
        return removed

    def _entry_files(self, root: str) -> Iterator[str]:
        """Entry files below ``root`` (links and other non-files included, so that clear
        removes them), never below the temporary or lock folders."""
        for folder, dirs, names in os.walk(root):
            if folder == self._root:
                dirs[:] = [d for d in dirs if d not in (TEMP_FOLDER, LOCKS_FOLDER)]
            for name in names:
                if name.endswith(SUFFIX):
                    yield os.path.join(folder, name)

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]:
        """Every readable entry, from its header and trailer; unreadable files are skipped."""
        root = os.path.join(self._root, _folder_name(namespace)) if namespace else self._root
        for path in self._entry_files(root):
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue  # a FIFO would block the reader
                yield describe_file(path)
            except (OSError, CorruptEntryError):
                continue

    def stats(self) -> dict[str, Any]:
        """Entries and bytes on disk; ``bytes`` counts the temporary files of writers still
        running (those of dead writers are removed first), as the cap does."""
        found = scan(self._root)
        return {
            "backend": "file",
            "directory": self._root,
            "entries": len(found.entries),
            "bytes": found.total,
            "temporary_files": found.temps,
            "max_bytes": self.max_bytes,
        }

    def evict(self) -> int:
        """Delete least recently used entries until the folder is under 90% of ``max_bytes``;
        how many. Waits at most a few seconds for writers holding the ledger (then: 0, logged);
        readers are unaffected because an open or mapped file keeps its bytes after unlinking.
        """
        if self._ledger is None:
            return 0
        with self._ledger.held(LEDGER_WAIT) as ledger:
            if ledger is None:
                logger.warning("size ledger of %s busy for %g s: eviction skipped",
                               self._root, LEDGER_WAIT)
                return 0
            try:
                return self._ledger.rescan(ledger)
            except OSError as exc:
                logger.warning("eviction in %s failed: %s", self._root, exc)
                return 0

    # -- locks ------------------------------------------------------------------------------

    def lock(self, key: Key, timeout: float) -> contextlib.AbstractContextManager[Held]:
        return self._exclusive(f"{LOCKS_FOLDER}/{key.hex}.lock", timeout)

    @contextlib.contextmanager
    def _exclusive(self, name: str, timeout: float) -> Iterator[Held]:
        """An flock-held file; the holder unlinks it before unlocking, so waiters re-check that
        the file they locked is still the one at the path."""
        path = os.path.join(self._root, name)
        fd = -1

        def attempt() -> bool:
            nonlocal fd
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
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


#: Errors that mean something other than an entry file sits at an entry's path.
_NOT_AN_ENTRY = frozenset((errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EAGAIN,
                           errno.ENODEV, errno.EOPNOTSUPP))
