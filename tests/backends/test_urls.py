"""Backends from URLs, strictly: a mistyped URL is an error naming the fix, never a folder, and a
store that cannot be made leaves decorating alone and fails the first call the usual way."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from arrowstash import FileBackend, cache
from arrowstash.backends import from_url
from arrowstash.backends.registry import file_folder, known_schemes, opened
from arrowstash.backends.unavailable import UnavailableBackend
from arrowstash.errors import BackendError


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: a URL taken for a relative path would land here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("url", ["redis://localhost:6379", "memcached://h:11211", "s3://b/k",
                                 "REDIS://localhost"])
def test_file_backend_refuses_other_schemes(cwd: Path, url: str) -> None:
    with pytest.raises(ValueError, match="FileBackend takes a folder or a file:// URL") as exc:
        FileBackend(url)
    assert url.split(":")[0].lower() + "://" in str(exc.value)
    assert list(cwd.iterdir()) == []


def test_file_backend_takes_a_file_url_and_a_path(cwd: Path) -> None:
    assert FileBackend(f"file://{cwd}/a").directory == cwd / "a"
    assert FileBackend("b").directory == cwd / "b"
    assert FileBackend(cwd / "c").directory == cwd / "c"  # a Path is a path, whatever it holds


def test_a_lost_colon_is_named_with_the_fix(cwd: Path) -> None:
    with pytest.raises(ValueError, match=r"did you mean 'redis://localhost'\?"):
        from_url("redis//localhost")
    assert list(cwd.iterdir()) == []


def test_file_backend_refuses_a_known_scheme_without_its_colon(cwd: Path) -> None:
    with pytest.raises(ValueError, match=r"looks like a redis:// URL without its colon"):
        FileBackend("redis//localhost")
    assert FileBackend("./redis//localhost").directory == cwd / "redis" / "localhost"
    assert [p.name for p in cwd.iterdir()] == ["redis"]  # only the folder asked for


@pytest.mark.parametrize("url", ["redis:/h", "memcached:h:11211", "s3:/bucket", "memory:"])
def test_a_known_scheme_without_its_slashes_is_named(cwd: Path, url: str) -> None:
    scheme = url.split(":")[0]
    with pytest.raises(ValueError, match=f"write {scheme}:// followed by the address"):
        from_url(url)
    assert list(cwd.iterdir()) == []


def test_a_mistyped_scheme_suggests_the_known_ones(cwd: Path) -> None:
    with pytest.raises(ValueError) as exc:
        from_url("reddis://localhost:6379")
    message = str(exc.value)
    assert "unknown scheme 'reddis'" in message and "did you mean redis://?" in message
    assert all(f"{scheme}://" in message for scheme in known_schemes())
    with pytest.raises(ValueError, match="known: file://") as far:
        from_url("gopher://x")
    assert "did you mean" not in str(far.value)
    assert list(cwd.iterdir()) == []


def test_errors_never_show_a_password() -> None:
    for url in ("reddis://user:hunter2@h:1", "redis//user:hunter2@h:1"):
        with pytest.raises(ValueError) as exc:
            from_url(url)
        assert "hunter2" not in str(exc.value) and "***" in str(exc.value)
    with pytest.raises(ValueError) as refused:
        FileBackend("redis://:hunter2@h:1")
    assert "hunter2" not in str(refused.value)


def test_a_relative_path_with_double_slash_is_still_a_path(cwd: Path) -> None:
    backend = from_url("data//cache")
    assert isinstance(backend, FileBackend) and backend.directory == cwd / "data" / "cache"


def test_file_folder_names_the_folder_without_making_it(
    cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert file_folder(f"file://{cwd}/x?encrypt=1") == cwd / "x"
    assert file_folder("rel") == cwd / "rel"
    assert file_folder("redis://h:1") is None
    assert file_folder("memory://") is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(cwd / "xdg"))
    assert file_folder(None) == cwd / "xdg" / "arrowstash"
    monkeypatch.setenv("ARROWSTASH_URL", "file:///somewhere/else")
    assert file_folder(None) == Path("/somewhere/else")
    assert list(cwd.iterdir()) == []


def test_an_unwritable_default_fails_the_first_call_not_the_decoration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ARROWSTASH_URL", f"{blocker}/cache")

    @cache
    def double(x: int) -> int:
        return 2 * x

    with caplog.at_level(logging.WARNING, logger="arrowstash.cache"):
        assert (double(1), double(1), double(2)) == (2, 2, 4)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert f"{blocker}/cache" in lines[0] and "cannot create cache folder" in lines[0]

    @cache(strict=True)
    def strict(x: int) -> int:
        return x

    with pytest.raises(BackendError, match="unavailable: cannot create cache folder"):
        strict(1)


def test_an_unwritable_url_becomes_an_unavailable_backend(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    backend = opened(f"file://{blocker}/sub?encrypt=1")
    assert isinstance(backend, UnavailableBackend)
    assert backend.encrypt and backend.capabilities == FileBackend.capabilities
    with pytest.raises(BackendError):
        backend.stats()
    with pytest.raises(ValueError, match="unknown scheme"):  # a malformed URL still raises
        opened("reddis://h")
