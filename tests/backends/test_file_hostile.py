"""The File backend against a hostile folder: other users' permissions, planted non-files, dead
writers' leftovers, and a cap shared by several processes (issue 20, items 1, 5, 7, 8)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arrowstash import FileBackend, StandardSerializer
from arrowstash.backends._file_io import NOT_AN_ENTRY, TEMP_FOLDER
from arrowstash.entry.format import EntryWriter, Key, parse_entry
from arrowstash.errors import BackendError, CorruptEntryError


def _key(i: int) -> Key:
    return Key("ns", "tests.f", i.to_bytes(4, "big") * 4)


def _put(backend: FileBackend, key: Key, value: object) -> int:
    return backend.set(EntryWriter(key, StandardSerializer().encode(value), time.time(), None))


def test_world_writable_folder_is_refused_without_a_secret(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(BackendError, match="writable by group or others"):
        FileBackend(folder)
    monkeypatch.setenv("ARROWSTASH_SECRET", "s3cret")
    assert FileBackend(folder).capabilities.shared  # accepted, as a shared store


def test_open_subfolder_is_refused_at_first_use(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    backend = FileBackend(tmp_path / "cache")
    _put(backend, _key(1), 1)
    shard = Path(backend.path(_key(1))).parent
    shard.chmod(0o777)
    with pytest.raises(BackendError, match="untrusted cache folder"):
        FileBackend(tmp_path / "cache").get(_key(1))


def test_symlinked_subfolder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    backend = FileBackend(tmp_path / "cache")
    shard = Path(backend.path(_key(1))).parent
    shard.parent.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    shard.symlink_to(outside)
    with pytest.raises(BackendError, match="symbolic link"):
        FileBackend(tmp_path / "cache").set(
            EntryWriter(_key(1), StandardSerializer().encode(1), time.time(), None))
    assert list(outside.iterdir()) == []


def test_planted_non_files_are_misses_that_never_hang(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FileBackend(tmp_path / "cache")
    paths = [Path(backend.path(_key(i))) for i in range(4)]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(paths[0])
    paths[1].symlink_to(tmp_path)
    paths[2].mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        monkeypatch.chdir(paths[3].parent)  # a socket's path must be short
        sock.bind(paths[3].name)
        started = time.monotonic()
        for i in range(4):
            stored = backend.get(_key(i))  # no bytes: parsing it is a logged miss
            assert stored is not None and stored.data.nbytes == 0, i
    assert time.monotonic() - started < 1.0
    _put(backend, _key(0), "replaces the FIFO")
    assert backend.get(_key(0)) not in (None, NOT_AN_ENTRY)


def test_dead_writers_temporary_files_are_counted_then_removed(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "cache", max_bytes=1 << 20)
    _put(backend, _key(1), 1)
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    temps = tmp_path / "cache" / TEMP_FOLDER
    live = next(iter(temps.iterdir()), None)
    assert live is None  # the writer's own temporary file is gone after the rename
    from arrowstash.backends import _file_io
    dead = temps / f"{_file_io._HOST}-{child.stdout.strip()}-abcdef.tmp"
    dead.write_bytes(b"x" * 1000)
    assert backend.clear() == 1
    assert not dead.exists()


def _writer(directory: str, cap: int, seed: int) -> None:
    backend = FileBackend(directory, max_bytes=cap)
    for i in range(60):
        _put(backend, Key("ns", "tests.f", (seed * 1000 + i).to_bytes(4, "big") * 4),
             b"v" * 20_000)


def _entry_bytes(folder: Path) -> int:
    """The entries' bytes at one moment: the writers evict while we look."""
    size = 0
    for path in folder.rglob("*.ast"):
        with contextlib.suppress(FileNotFoundError):
            size += path.stat().st_size
    return size


def test_cap_holds_with_several_writer_processes(tmp_path: Path) -> None:
    import multiprocessing

    cap = 400_000
    directory = str(tmp_path / "cache")
    FileBackend(directory, max_bytes=cap)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(directory, cap, n)) for n in range(6)]
    for p in procs:
        p.start()
    peak = 0
    while any(p.is_alive() for p in procs):
        peak = max(peak, _entry_bytes(Path(directory)))
        time.sleep(0.005)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    # at most the entries being written at that moment (6 of ~20 KB) over the cap
    assert peak <= cap + 6 * 21_000, peak


def test_clear_and_delete_never_wait_for_a_held_ledger(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "cache", max_bytes=1 << 20)
    _put(backend, _key(1), 1)
    with backend._ledger.held(1.0) as held:  # type: ignore[union-attr]
        assert held is not None
        started = time.monotonic()
        assert backend.delete(_key(1))
        backend.clear()
        assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("size", [1 << 40, 3 << 20, 100], ids=["sparse-TiB", "padded", "cut"])
def test_a_file_not_of_its_declared_size_is_never_mapped(tmp_path: Path, size: int) -> None:
    """An entry extended (a sparse terabyte: mapping it fails or reserves a terabyte) or cut
    short is a miss that parsing reports, never a map of the file nor a backend error."""
    backend = FileBackend(tmp_path / "cache")
    _put(backend, _key(1), b"x" * 2_000_000)  # a mapped entry
    path = Path(backend.path(_key(1)))
    temp = path.with_name("planted")
    temp.write_bytes(path.read_bytes())
    os.truncate(temp, size)
    os.replace(temp, path)
    stored = backend.get(_key(1))
    assert stored is not None and not stored.mapped and stored.data.nbytes <= 4096
    with pytest.raises(CorruptEntryError, match="truncated or padded"):
        parse_entry(stored.data)
