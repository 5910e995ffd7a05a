"""The size of a File backend's folder, shared by every process writing to it.

A process that only counted its own writes would let six writers overshoot a cap six times over.
The ledger is one small file (``.space``) holding the folder's total size: a writer with a cap
locks it, puts its entry in place, adds the entry's size and, past the cap, evicts least recently
used entries before unlocking. A full scan corrects the total whenever it goes over the cap, when
it is older than ``RESCAN_SECONDS`` (writers killed between two steps leave it a little off) and
after a lock wait timed out or a ``clear`` (both delete the ledger: the next writer rescans).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from arrowstash.backends._file_io import TEMP_FOLDER, TEMP_SUFFIX, is_orphan
from arrowstash.backends.base import Held, take_lock

SUFFIX = ".ast"
LEDGER = ".space"
LOCKS_FOLDER = ".locks"
#: Longest wait for the ledger's lock; past it the writer skips the accounting (and deletes the
#: ledger so that the next one rescans) rather than stall a cached call.
LEDGER_WAIT = 2.0
RESCAN_SECONDS = 60.0
#: Eviction goes down to this share of the cap, so that it runs once per tenth of a cap written.
EVICT_TO = 0.9
_FORMAT = struct.Struct("<qd")  # total bytes, time of the last full scan
logger = logging.getLogger("arrowstash.backends.file")


@dataclass
class Scan:
    """What a walk of the folder found: entries as (mtime_ns, size, path), and the temporary
    files of live writers; leftovers of dead writers are deleted on the way."""

    entries: list[tuple[int, int, str]] = field(default_factory=list)
    temp_bytes: int = 0
    temps: int = 0

    @property
    def total(self) -> int:
        return sum(size for _, size, _ in self.entries) + self.temp_bytes


def scan(root: str, entries: bool = True) -> Scan:
    """Walk ``root`` (never following links), removing temporary files left by dead writers."""
    found = Scan()
    now = time.time()
    for folder, dirs, names in os.walk(root):
        if folder == root and LOCKS_FOLDER in dirs:
            dirs.remove(LOCKS_FOLDER)
        in_temps = os.path.basename(folder) == TEMP_FOLDER
        for name in names:
            path = os.path.join(folder, name)
            is_entry = name.endswith(SUFFIX) and not in_temps
            if not (is_entry or name.endswith(TEMP_SUFFIX)):
                continue
            try:
                st = os.lstat(path)
                if not is_entry and is_orphan(name, st.st_mtime, now):
                    os.unlink(path)
                    continue
            except FileNotFoundError:
                continue
            if is_entry:
                if entries:
                    found.entries.append((st.st_mtime_ns, st.st_size, path))
            else:
                found.temp_bytes += st.st_size
                found.temps += 1
    return found


def evict_scanned(found: Scan, goal: float) -> tuple[int, int]:
    """Delete the least recently used entries of ``found`` until the total is at most ``goal``;
    (entries removed, total left). Deleting never truncates: a reader's map keeps its pages."""
    total = found.total
    removed = 0
    for _, size, path in sorted(found.entries):
        if total <= goal:
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed += 1
        total -= size
    return removed, total


class Ledger:
    """The shared total of one folder, read and written under an flock of its file."""

    def __init__(self, root: str, max_bytes: int) -> None:
        self.root = root
        self.path = os.path.join(root, LEDGER)
        self.max_bytes = max_bytes

    def forget(self) -> None:
        """Delete the ledger, so that the next writer rescans the folder."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    @contextlib.contextmanager
    def held(self, timeout: float) -> Iterator[int | None]:
        """The ledger's descriptor, locked; None when the lock stayed busy for ``timeout``
        (the caller then goes on without it) or the ledger cannot be opened."""
        fd = -1

        def attempt() -> bool:
            nonlocal fd
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    return True  # still the ledger, not one a clear deleted meanwhile
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT):
                    raise
            os.close(fd)
            return False

        try:
            taken = take_lock(attempt, timeout)
        except OSError as exc:
            logger.warning("cannot lock the size ledger %s: %s", self.path, exc)
            taken = Held.TIMEOUT
        if not taken:
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def add(self, fd: int, delta: int) -> int:
        """Add ``delta`` bytes to the total (rescanning a missing or old ledger), evict past the
        cap, and store the result; entries evicted."""
        raw = os.pread(fd, _FORMAT.size, 0)
        now = time.time()
        if len(raw) == _FORMAT.size:
            total, scanned = _FORMAT.unpack(raw)
            total += delta
        if len(raw) != _FORMAT.size or total < 0 or not now - RESCAN_SECONDS < scanned <= now:
            return self.rescan(fd)  # delta's entry is in place: the scan sees it
        if total <= self.max_bytes:
            os.pwrite(fd, _FORMAT.pack(total, scanned), 0)
            return 0
        return self.rescan(fd)

    def rescan(self, fd: int) -> int:
        """Count the folder again and evict past the cap; entries evicted."""
        found = scan(self.root)
        removed = 0
        total = found.total
        if total > self.max_bytes:
            removed, total = evict_scanned(found, self.max_bytes * EVICT_TO)
        os.pwrite(fd, _FORMAT.pack(total, time.time()), 0)
        return removed
