"""Shared fixtures: real backends in a temporary folder, and a process environment that never
points the default backend at the user's own cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arrowstash import Backend, FileBackend, MemoryBackend


@pytest.fixture(autouse=True)
def _isolated_environment(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backend=DEFAULT`` resolves to a throwaway folder, whatever the developer's shell has."""
    monkeypatch.delenv("ARROWSTASH_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def file_backend(cache_dir: Path) -> FileBackend:
    return FileBackend(cache_dir)


@pytest.fixture
def memory_backend() -> MemoryBackend:
    return MemoryBackend()


#: Backends every contract test runs against; add server-bound ones (with their markers) here.
BACKENDS = ["file", "memory"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    made: Backend = request.getfixturevalue(f"{request.param}_backend")
    yield made
    made.clear()
