"""Documented limits of the File backend, tested (issue 20, item 11).

- A replayed older encrypted entry is served until its (authenticated) expiry, then it is a miss.
- Truncating a mapped file from outside would kill its reader with SIGBUS; arrowstash itself
  never does it: overwrite, delete, eviction, clear and ``arrowstash purge`` replace or unlink
  files, so a process that maps an entry keeps reading the old bytes, every page of them.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arrowstash import FileBackend, StandardSerializer, cache
from arrowstash.entry.format import EntryWriter, Key

KEY = os.urandom(32)
TIMEOUT = 60


# -- replay of an encrypted entry ----------------------------------------------------------------


def test_an_expired_replay_of_an_encrypted_entry_is_a_miss(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "cache")
    values = {1: "old"}
    runs: list[int] = []

    @cache(backend=backend, l1=False, encryption_key=KEY, ttl=1.0)
    def balance(n: int) -> str:
        runs.append(n)
        return values[n]

    assert balance(1) == "old"
    stored_by = time.time()  # the old entry was created before this: it expires by + 1 s
    path = Path(backend.path(balance.cache_key(1)))
    old = path.read_bytes()
    values[1] = "new"
    balance.cache_clear()
    assert balance(1) == "new" and runs == [1, 1]

    def replay() -> None:  # as a writer of the folder would: a whole file renamed into place
        temp = path.with_name(path.name + ".replay")
        temp.write_bytes(old)
        os.replace(temp, path)

    replay()
    assert balance(1) == "old" and runs == [1, 1]  # the documented limit: served until expiry
    time.sleep(max(0.0, stored_by + 1.0 - time.time()) + 0.05)  # past the old entry's expiry
    replay()
    assert balance(1) == "new" and runs == [1, 1, 1]
    assert balance.cache_info().errors == 0  # expired, not damaged: a plain miss
    replay()
    assert balance(1) == "new" and runs == [1, 1, 1, 1]  # and stays a miss


# -- nobody truncates a mapped entry --------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import hashlib, sys
    from arrowstash import FileBackend
    from arrowstash.entry.format import Key
    backend = FileBackend(sys.argv[1])
    held = backend.get(Key("ns", "mod.fn", bytes.fromhex(sys.argv[2])))
    assert held is not None and held.mapped, "the entry is not mapped"
    print("mapped", flush=True)
    sys.stdin.readline()  # the parent has run its operation
    print(hashlib.sha256(held.data).hexdigest(), flush=True)  # touches every page
""")


def _put(backend: FileBackend, key: Key, value: Any, expires: float | None = None) -> None:
    backend.set(EntryWriter(key, StandardSerializer().encode(value), time.time(), expires))


def _purge(folder: Path, *how: str) -> None:
    subprocess.run([sys.executable, "-m", "arrowstash", "purge", str(folder), *how],
                   check=True, capture_output=True, timeout=TIMEOUT)


def _other_writer_overflows_the_cap(folder: Path, key: Key) -> None:
    capped = FileBackend(folder, max_bytes=1 << 20)
    for i in range(4):  # each write evicts the least recently used, the mapped one first
        _put(capped, Key("ns", "mod.other", i.to_bytes(16, "big")), bytes(400_000))
    assert not Path(capped.path(key)).exists()


OPERATIONS: dict[str, Callable[[Path, Key], None]] = {
    "overwrite": lambda folder, key: _put(FileBackend(folder), key, os.urandom(4_000_000)),
    "delete": lambda folder, key: FileBackend(folder).delete(key) or None,
    "evict": lambda folder, key: FileBackend(folder, max_bytes=1).evict() and None,
    "evict-on-write": _other_writer_overflows_the_cap,
    "clear": lambda folder, key: FileBackend(folder).clear() and None,
    "clear-function": lambda folder, key: FileBackend(folder).clear("ns", "mod.fn") and None,
    "purge-all": lambda folder, key: _purge(folder, "--all"),
    "purge-expired": lambda folder, key: _purge(folder, "--expired"),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_mapped_entry_survives_every_removal_in_another_process(tmp_path: Path,
                                                                  operation: str) -> None:
    folder = tmp_path / "cache"
    key = Key("ns", "mod.fn", os.urandom(16))
    # 4 MB, past the map threshold; expired already, so that purge --expired takes it.
    _put(FileBackend(folder), key, os.urandom(4_000_000), time.time() - 1)
    path = Path(FileBackend(folder).path(key))
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(folder), key.digest.hex()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "mapped", child.stderr
        OPERATIONS[operation](folder, key)
        assert not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != expected
        out, err = child.communicate("go\n", timeout=TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != -signal.SIGBUS, "the mapped entry was truncated under its reader"
    assert child.returncode == 0, err
    assert out.strip() == expected  # the old bytes, all of them
