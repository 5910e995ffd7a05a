"""A pickle planted in a File cache by another writer never runs for a ``serializer="auto"``
function (issue 20, item 1, the pipeline's side): the entry is a real pickle stored under the
function's key exactly as the File backend stores entries, and unpickling it would create a
marker folder. Without a secret an untrusted folder is not used at all; with one, an unsigned
entry or one signed with another secret is a logged miss and the call recomputes."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arrowstash import BufferSerializer, FileBackend, cache
from arrowstash.entry.format import Key, entry_bytes

SECRET = "s3cret"


class Planted:
    """Pickles to a call of ``os.mkdir(marker)``: loading the entry is running that code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return os.mkdir, (str(self.marker),)


def _plant(backend: FileBackend, key: Key, marker: Path, sign_with: bytes | None) -> Path:
    """A pickle entry for ``key``, written where and as the File backend writes entries (a
    complete file renamed into place), as another writer of the folder would."""
    encoded = BufferSerializer().encode(Planted(marker))
    encoded.sign_with = sign_with
    raw = entry_bytes(key, encoded, created=time.time(), expires=None)
    target = Path(backend.path(key))
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(target.name + ".planting")
    temp.write_bytes(raw)
    os.replace(temp, target)
    return target


def _function(backend: FileBackend | str, calls: list[int]) -> Any:
    @cache(backend=backend, l1=False, serializer="auto")
    def double(x: int) -> dict[str, int]:
        calls.append(x)
        return {"x": 2 * x}

    return double


def _shared_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def test_the_planted_entry_would_run_code_if_loaded(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: in the owner's private folder, where every writer is the owner, the same entry
    is a valid entry and loading it runs the code; the other tests' refusals are not a failure
    to plant."""
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    backend = FileBackend(tmp_path / "private")
    calls: list[int] = []
    double = _function(backend, calls)
    marker = tmp_path / "ran"
    _plant(backend, double.cache_key(3), marker, None)
    double(3)
    assert marker.is_dir() and calls == []


def test_untrusted_folder_without_a_secret_never_loads_a_planted_pickle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    folder = _shared_folder(tmp_path)
    monkeypatch.setenv("ARROWSTASH_SECRET", SECRET)  # only to plant through a FileBackend
    planter = FileBackend(folder)
    monkeypatch.delenv("ARROWSTASH_SECRET")
    calls: list[int] = []
    double = _function(str(folder), calls)
    marker = tmp_path / "ran"
    entry = _plant(planter, double.cache_key(3), marker, None)
    assert double(3) == {"x": 6} and double(3) == {"x": 6}
    assert calls == [3, 3] and not marker.exists()  # the folder is not used at all
    assert entry.is_file()


def test_open_shard_under_a_private_root_never_loads_a_planted_pickle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root is private but one function's folder was opened to others, who planted an
    entry there: the next process's first use of that folder refuses it and the call computes.
    (A process checks each folder once, at its first use: see FolderGuard.)"""
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    calls: list[int] = []
    planter = FileBackend(tmp_path / "cache")
    marker = tmp_path / "ran"
    entry = _plant(planter, _function(planter, calls).cache_key(3), marker, None)
    entry.parent.chmod(0o777)
    double = _function(FileBackend(tmp_path / "cache"), calls)
    assert double(3) == {"x": 6} and calls == [3]
    assert not marker.exists() and entry.is_file()


@pytest.mark.parametrize("sign_with", [None, b"not the secret"], ids=["absent-tag", "forged-tag"])
def test_shared_folder_with_a_secret_refuses_unsigned_or_forged_pickles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        sign_with: bytes | None) -> None:
    monkeypatch.setenv("ARROWSTASH_SECRET", SECRET)
    folder = _shared_folder(tmp_path)
    backend = FileBackend(folder)
    assert backend.capabilities.shared
    calls: list[int] = []
    double = _function(backend, calls)
    marker = tmp_path / "ran"
    _plant(backend, double.cache_key(3), marker, sign_with)  # well formed, checksums valid
    with caplog.at_level(logging.WARNING, logger="arrowstash"):
        assert double(3) == {"x": 6}
    assert calls == [3] and not marker.exists()
    assert double.cache_info().errors == 1
    assert any("signature" in r.getMessage() for r in caplog.records)
    assert double(3) == {"x": 6} and calls == [3]  # its own signed entry replaced the plant
    assert not marker.exists()
