"""Log lines of cache events: their structured fields, the rate limit of repeated failures, and
the absence of keys, arguments, values and secrets."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from arrowstash import FileBackend, cache
from arrowstash.caching import logs

LOGGER = "arrowstash.cache"
FIELDS = ("event", "function", "namespace", "backend", "key_hash", "error", "suppressed")


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def _break_folder(backend: FileBackend) -> None:
    shutil.rmtree(backend.directory, ignore_errors=True)
    backend.directory.write_text("not a folder")


def test_corrupt_entry_line_carries_the_fields(
    file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    @cache(backend=file_backend, l1=False, namespace="prices")
    def f(x: int) -> int:
        return x

    f(1)
    key = f.cache_key(1)
    Path(file_backend.path(key)).write_bytes(b"garbage" * 20)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        f(1)
    [record] = _events(caplog, "corrupt_entry")
    assert record.name == LOGGER and record.levelno == logging.WARNING
    assert {name: getattr(record, name) for name in FIELDS} == {
        "event": "corrupt_entry", "function": f"{__name__}.{f.__qualname__}",
        "namespace": "prices", "backend": "FileBackend", "key_hash": key.hex[:12],
        "error": "CorruptEntryError", "suppressed": 0,
    }
    assert "\n" not in record.getMessage()
    assert f.cache_info().errors == 1


def test_repeated_failures_are_rate_limited_with_a_suppressed_count(
    file_backend: FileBackend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "RATE_LIMIT_SECONDS", 0.5)

    @cache(backend=file_backend, l1=False, lock=False)
    def f(x: int) -> int:
        return x

    @cache(backend=file_backend, l1=False, lock=False)
    def g(x: int) -> int:
        return x

    f(0)
    Path(file_backend.path(f.cache_key(0))).write_bytes(b"garbage" * 20)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        started = time.monotonic()
        f(0)  # a corrupt entry
        _break_folder(file_backend)
        for i in range(1, 5):
            f(i)  # failing reads
        g(0)  # another function has a limiter of its own
        if time.monotonic() - started < 0.5:  # else the machine was too slow to tell
            # one line per function and kind: the corrupt entry did not hold back the reads
            assert [(r.event, r.function) for r in caplog.records] == [
                ("corrupt_entry", f._core.name), ("backend_read", f._core.name),
                ("backend_read", g._core.name)]
        time.sleep(0.55)
        f(9)
    last = caplog.records[-1]
    assert (last.event, last.function) == ("backend_read", f._core.name)
    assert last.suppressed >= 1
    assert f"({last.suppressed} similar lines suppressed)" in last.getMessage()
    assert f.cache_info().errors == 6  # every failure is counted, logged or not


def test_lock_timeout_is_logged_and_counted(
    file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []

    @cache(backend=file_backend, lock_timeout=0.05)
    def f(x: int) -> int:
        runs.append(x)
        return x

    with file_backend.lock(f.cache_key(1), 1.0), caplog.at_level(logging.WARNING, LOGGER):
        assert f(1) == 1  # another holder never finishes: the call computes anyway
    assert runs == [1]
    [record] = _events(caplog, "lock_timeout")
    assert record.key_hash == f.cache_key(1).hex[:12] and "computing anyway" in record.getMessage()
    assert f._core.stats.error_kinds == {"lock_timeout": 1}
    assert f.cache_info().errors == 0  # slow, not failed: cache_info counts failures only


def _leaks(records: list[logging.LogRecord], secrets: list[str]) -> list[str]:
    found = []
    for record in records:
        text = record.getMessage() + " " + " ".join(map(str, vars(record).values()))
        found += [s for s in secrets if s in text]
    return found


def test_lines_hold_no_key_argument_value_or_secret(
    file_backend: FileBackend, caplog: pytest.LogCaptureFixture
) -> None:
    @cache(backend=file_backend, l1=False, secret="s3cret-signing-key")
    def f(card: str) -> dict[str, Any]:
        return {"owner": "VALUE-MARKER-" + card}

    card = "4111-1111-1111-1111"
    f(card)
    key = f.cache_key(card)
    Path(file_backend.path(key)).write_bytes(b"x" * 100)  # a corrupt entry
    locks = file_backend.directory / ".locks"
    shutil.rmtree(locks)
    locks.write_text("not a folder")  # failing locks: their errors name paths
    with caplog.at_level(logging.DEBUG, logger="arrowstash"):
        f(card)
        _break_folder(file_backend)  # failing reads
        f(card)
    assert [r.event for r in caplog.records] == ["corrupt_entry", "backend_lock", "backend_read"]
    assert any(key.hex[:12] + "…" in r.getMessage() for r in caplog.records)  # paths, shortened
    assert _leaks(caplog.records, [key.hex, card, "VALUE-MARKER", "s3cret-signing-key"]) == []


def test_a_redis_url_password_stays_out_of_the_lines(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("redis")
    from arrowstash import RedisBackend

    backend = RedisBackend("redis://:hunter2pass@127.0.0.1:1/0", connect_timeout=0.05)

    @cache(backend=backend)
    def f(x: int) -> int:
        return x

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert f(1) == 1
    [record] = _events(caplog, "backend_read")
    assert record.backend == "RedisBackend" and record.error == "BackendError"
    assert _leaks(caplog.records, ["hunter2pass"]) == []
    backend.close()
