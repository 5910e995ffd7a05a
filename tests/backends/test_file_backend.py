"""What only the File backend does: its folder, atomic writes, eviction, mapped reads, errors."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from arrowstash import BackendError, FileBackend, Key, StandardSerializer
from arrowstash.entry.format import Encoded, EntryWriter, parse_entry

SER = StandardSerializer()


def _key(n: int, namespace: str = "ns", function: str = "mod.fn") -> Key:
    return Key(namespace, function, n.to_bytes(16, "big"))


def _put(backend: FileBackend, key: Key, value: Any, expires: float | None = None) -> int:
    return backend.set(EntryWriter(key, SER.encode(value), time.time(), expires))


def _all_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _decoded(backend: FileBackend, key: Key) -> Any:
    stored = backend.get(key)
    assert stored is not None
    entry = parse_entry(stored.data)
    return SER.decode(entry.meta, entry.sections)


# -- the folder ---------------------------------------------------------------------------------


def test_folder_is_created_private(tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "er" / "cache"
    backend = FileBackend(folder)
    assert folder.is_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert backend.directory == folder


def test_entry_files_are_private(file_backend: FileBackend) -> None:
    key = _key(1)
    _put(file_backend, key, "secret")
    assert stat.S_IMODE(os.stat(file_backend.path(key)).st_mode) == 0o600


def test_relative_and_user_paths_are_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert FileBackend("rel").directory == tmp_path / "rel"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert FileBackend("~/c").directory == tmp_path / "home" / "c"


def test_entries_live_under_namespace_and_function_folders(file_backend: FileBackend) -> None:
    key = _key(0xABCDEF, "my_ns", "pkg.mod.func")
    path = Path(file_backend.path(key))
    assert path.relative_to(file_backend.directory).parts == (
        "my_ns", "pkg.mod.func", key.hex[:2], f"{key.hex}.ast"
    )


def test_invalid_arguments(tmp_path: Path, file_backend: FileBackend) -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_bytes"):
            FileBackend(tmp_path / "never", max_bytes=bad)
    assert not (tmp_path / "never").exists()
    with pytest.raises(ValueError, match="namespace"):
        file_backend.clear(function="f")


# -- atomic writes ------------------------------------------------------------------------------


def test_set_leaves_only_the_entry_file(file_backend: FileBackend) -> None:
    for n in range(5):
        _put(file_backend, _key(n), list(range(n)))
    files = _all_files(file_backend.directory)
    assert len(files) == 5
    assert all(p.suffix == ".ast" and not p.name.startswith(".") for p in files)


def test_entry_appears_only_when_complete(file_backend: FileBackend) -> None:
    key = _key(1)
    _put(file_backend, key, "old")
    seen: list[Any] = []

    def streamed(out: Any) -> None:
        out.write(b"new data")
        seen.append(_decoded(file_backend, key))  # readers still see the old entry

    file_backend.set(EntryWriter(key, Encoded("raw", None, [streamed]), 0.0, None))
    assert seen == ["old"]
    stored = file_backend.get(key)
    assert stored is not None
    assert bytes(parse_entry(stored.data).sections[0]) == b"new data"


def test_failed_write_keeps_the_old_entry_and_leaves_no_temp_file(
    file_backend: FileBackend,
) -> None:
    key = _key(1)
    _put(file_backend, key, "old")

    def failing(out: Any) -> None:
        out.write(b"partial")
        raise RuntimeError("serializer failed halfway")

    with pytest.raises(RuntimeError, match="halfway"):
        file_backend.set(EntryWriter(key, Encoded("raw", None, [failing]), 0.0, None))
    assert _decoded(file_backend, key) == "old"
    assert len(_all_files(file_backend.directory)) == 1


def test_durable_writes_fsync_the_file_and_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    backend = FileBackend(tmp_path / "c", durable=True)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    key = _key(1)
    _put(backend, key, {"durable": True})
    assert len(synced) >= 2  # the entry, then the folder holding it
    assert _decoded(backend, key) == {"durable": True}
    plain = FileBackend(tmp_path / "p")
    synced.clear()
    _put(plain, key, 1)
    assert synced == []


def test_clear_removes_stale_temp_files_but_not_fresh_ones(file_backend: FileBackend) -> None:
    key = _key(1)
    _put(file_backend, key, 1)
    folder = Path(file_backend.path(key)).parent
    stale, fresh = folder / ".dead.1.aaaa.tmp", folder / ".busy.2.bbbb.tmp"
    stale.write_bytes(b"left by a writer that died")
    fresh.write_bytes(b"being written right now")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    assert file_backend.clear() == 1  # counts entries only
    assert not stale.exists()
    assert fresh.exists()


def test_unreadable_files_are_skipped_by_entries_but_counted_by_stats(
    file_backend: FileBackend,
) -> None:
    _put(file_backend, _key(1), "good")
    bad = _key(2)
    _put(file_backend, bad, "soon bad")
    Path(file_backend.path(bad)).write_bytes(b"garbage")
    assert [e.key for e in file_backend.entries()] == [_key(1).hex]
    assert file_backend.stats()["entries"] == 2


# -- eviction -----------------------------------------------------------------------------------


def _tick() -> None:
    time.sleep(0.02)  # file times have the kernel's coarse clock granularity


def test_max_bytes_keeps_the_folder_under_the_cap(tmp_path: Path) -> None:
    probe = FileBackend(tmp_path / "probe")
    size = _put(probe, _key(0), bytes(1000))
    cap = int(size * 5.5)
    backend = FileBackend(tmp_path / "c", max_bytes=cap)
    for n in range(30):
        _put(backend, _key(n), bytes(1000))
        assert backend.stats()["bytes"] <= cap
    assert backend.stats()["entries"] >= 4
    assert backend.get(_key(29)) is not None  # the newest survives


def test_eviction_removes_least_recently_used_first(tmp_path: Path) -> None:
    probe = FileBackend(tmp_path / "probe")
    size = _put(probe, _key(0), bytes(1000))
    backend = FileBackend(tmp_path / "c", max_bytes=int(size * 3.5))
    a, b, c, d = (_key(n) for n in range(4))
    for key in (a, b, c):
        _put(backend, key, bytes(1000))
        _tick()
    assert backend.get(a) is not None  # a read makes `a` recently used
    _tick()
    _put(backend, d, bytes(1000))
    assert backend.get(b) is None, "the least recently used entry should have been evicted"
    assert all(backend.get(k) is not None for k in (a, c, d))
    assert backend.stats()["bytes"] <= backend.max_bytes


def test_explicit_evict(tmp_path: Path) -> None:
    unbounded = FileBackend(tmp_path / "c")
    for n in range(6):
        _put(unbounded, _key(n), bytes(1000))
        _tick()
    assert unbounded.evict() == 0  # no cap, nothing to do
    total = unbounded.stats()["bytes"]
    capped = FileBackend(tmp_path / "c", max_bytes=total // 2)
    removed = capped.evict()
    assert removed >= 3
    assert capped.stats()["bytes"] <= total // 2 * 0.9
    assert capped.get(_key(5)) is not None and capped.get(_key(0)) is None


# -- mapped reads -------------------------------------------------------------------------------


def test_large_entries_are_mapped_privately(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "c", mmap_threshold=4096)
    big, small = _key(1), _key(2)
    payload = bytes(range(256)) * 64
    _put(backend, big, payload)
    _put(backend, small, b"tiny")
    path = backend.path(big)
    on_disk = Path(path).read_bytes()

    stored = backend.get(big)
    assert stored is not None and stored.mapped
    assert not stored.data.readonly
    entry = parse_entry(stored.data, check_sections=False)
    assert SER.decode(entry.meta, entry.sections) == payload
    stored.data[100] ^= 0xFF  # a write to the map goes to private pages...
    stored.data[-1] ^= 0xFF
    assert stored.data[100] == on_disk[100] ^ 0xFF
    assert Path(path).read_bytes() == on_disk  # ...never to the file
    again = backend.get(big)
    assert again is not None and bytes(again.data) == on_disk  # nor to other readers

    small_stored = backend.get(small)
    assert small_stored is not None and not small_stored.mapped


def test_entries_read_through_a_map_carry_digests_too(tmp_path: Path) -> None:
    """Mapped reads skip section digests (unless verify=True), but the writer hashes every
    section (issue 20, item 6): a reader that reads in, or verifies, checks them."""
    backend = FileBackend(tmp_path / "c", mmap_threshold=4096)
    big, small = _key(1), _key(2)
    _put(backend, big, bytes(range(256)) * 64)
    _put(backend, small, b"tiny")
    parsed = _parsed(backend, big)
    assert [row[2] for row in parsed.trailer.sections] == [
        xxhash.xxh3_64_intdigest(section) for section in parsed.sections]
    (digest,) = [row[2] for row in _parsed(backend, small).trailer.sections]
    assert isinstance(digest, int)
    reads_in = FileBackend(tmp_path / "c", mmap_threshold=1 << 20)
    stored = reads_in.get(big)
    assert stored is not None and not stored.mapped
    entry = parse_entry(stored.data)  # checks what it can: header, trailer, bounds
    assert SER.decode(entry.meta, entry.sections) == bytes(range(256)) * 64


def _parsed(backend: FileBackend, key: Key) -> Any:
    return parse_entry(Path(backend.path(key)).read_bytes())


def test_map_survives_the_file_being_replaced(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "c", mmap_threshold=4096)
    key = _key(1)
    _put(backend, key, b"a" * 10_000)
    stored = backend.get(key)
    assert stored is not None and stored.mapped
    _put(backend, key, b"b" * 20_000)
    entry = parse_entry(stored.data)
    assert SER.decode(entry.meta, entry.sections) == b"a" * 10_000


# -- errors -------------------------------------------------------------------------------------


def test_folder_under_a_regular_file_is_a_backend_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BackendError, match="cannot create") as excinfo:
        FileBackend(blocker / "cache")
    assert isinstance(excinfo.value.__cause__, OSError)


@pytest.fixture
def broken_backend(file_backend: FileBackend) -> FileBackend:
    """A backend whose folder was replaced by a regular file after it was opened."""
    _put(file_backend, _key(1), "x")
    shutil.rmtree(file_backend.directory)
    file_backend.directory.write_text("not a folder any more")
    return file_backend


def test_set_on_an_unusable_folder_is_a_backend_error(broken_backend: FileBackend) -> None:
    with pytest.raises(BackendError) as excinfo:
        _put(broken_backend, _key(2), "y")
    assert isinstance(excinfo.value.__cause__, OSError)


def test_get_and_delete_on_an_unusable_folder_are_backend_errors(
    broken_backend: FileBackend,
) -> None:
    with pytest.raises(BackendError):
        broken_backend.get(_key(1))
    with pytest.raises(BackendError):
        broken_backend.delete(_key(1))


def test_lock_on_an_unusable_folder_is_a_backend_error(broken_backend: FileBackend) -> None:
    """The lock file's os.open error (here NotADirectoryError; EACCES or ENOSPC on a read-only
    or full disk) is translated at the boundary, never a plain OSError."""
    with pytest.raises(BackendError), broken_backend.lock(_key(1), timeout=0.1):
        pass


def test_set_with_an_unwritable_entry_path_is_a_backend_error(file_backend: FileBackend) -> None:
    key = _key(1)
    path = Path(file_backend.path(key))
    path.mkdir(parents=True)  # a folder where the entry file should go
    with pytest.raises(BackendError):
        _put(file_backend, key, "x")
    assert [p for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
