"""The File backend's read path: one read of a page for small entries, the rest read or mapped
for larger ones, and the reuse of a validated header only for the very same stored bytes."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from arrowstash import FileBackend, cache


@pytest.mark.parametrize("size", [0, 3_900, 4_096, 5_000, 200_000])
def test_entries_around_the_first_read_round_trip(tmp_path: Path, size: int) -> None:
    backend = FileBackend(tmp_path / "c")
    calls = []

    def payload(n: int) -> bytes:
        return bytes(range(256)) * (n // 256) + b"x" * (n % 256)

    @cache(backend=backend, l1=False)
    def f(n: int) -> bytes:
        calls.append(n)
        return payload(n)

    expected = payload(size)
    for _ in range(3):  # computed, then read twice (the second with the validated header)
        assert f(size) == expected
    assert calls == [size]
    stored = backend.get(f.cache_key(size))
    assert stored is not None and stored.data.nbytes == os.path.getsize(
        backend.path(f.cache_key(size)))
    assert f.cache_info().errors == 0


def test_a_small_mmap_threshold_still_maps(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "c", mmap_threshold=64)

    @cache(backend=backend, l1=False)
    def f(n: int) -> list[int]:
        return list(range(n))

    assert f(10) == f(10) == list(range(10))
    stored = backend.get(f.cache_key(10))
    assert stored is not None and stored.mapped


@pytest.mark.parametrize("size", [100, 20_000])
def test_damage_after_a_validated_read_is_a_logged_miss(
    tmp_path: Path, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    backend = FileBackend(tmp_path / "c")
    calls = []

    @cache(backend=backend, l1=False)
    def f(n: int) -> bytes:
        calls.append(n)
        return b"v" * n

    f(size)
    f(size)  # the header is now validated and remembered
    path = backend.path(f.cache_key(size))
    raw = bytearray(Path(path).read_bytes())
    raw[100] ^= 0xFF  # inside the section: the header bytes are unchanged
    Path(path).write_bytes(raw)
    with caplog.at_level(logging.WARNING, logger="arrowstash"):
        assert f(size) == b"v" * size
    assert len(calls) == 2
    Path(path).write_bytes(raw[: len(raw) // 2])  # truncated
    assert f(size) == b"v" * size
    assert len(calls) == 3
    assert f.cache_info().errors >= 2


def test_an_entry_copied_to_another_key_is_a_miss_even_after_both_were_read(
    tmp_path: Path,
) -> None:
    backend = FileBackend(tmp_path / "c")
    calls = []

    @cache(backend=backend, l1=False)
    def f(n: int) -> int:
        calls.append(n)
        return n

    for _ in range(2):
        assert (f(1), f(2)) == (1, 2)
    shutil.copyfile(backend.path(f.cache_key(1)), backend.path(f.cache_key(2)))
    assert f(2) == 2  # never 1
    assert calls == [1, 2, 2]


@pytest.mark.parametrize("kind", ["array", "bytes"])
def test_reserved_space_of_a_large_entry_ends_exactly_at_the_entry(
        tmp_path: Path, kind: str) -> None:
    import numpy as np

    backend = FileBackend(tmp_path / "c")

    @cache(backend=backend, l1=False)
    def f(n: int) -> object:
        return np.arange(n, dtype=np.float64) if kind == "array" else b"b" * n * 8

    n = (5 << 20) // 8 + 3  # over the reservation threshold, not a multiple of the alignment
    first = f(n)
    again = f(n)
    if kind == "array":
        assert np.array_equal(again, first)
    else:
        assert again == first
    path = backend.path(f.cache_key(n))
    stored = backend.get(f.cache_key(n))
    assert stored is not None and stored.data.nbytes == os.path.getsize(path)
    assert f.cache_info().errors == 0
