"""``arrowstash verify [URL]`` (issue 20, item 6): a scrub reads every entry whole, reports and
removes the damaged ones (a flipped bit in a large mapped entry; a forged entry on a real Redis
under a secret) and leaves sound ones alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis

import arrowstash
from arrowstash import FileBackend
from arrowstash.cli.main import main
from arrowstash.entry.format import Key, entry_bytes, parse_entry
from arrowstash.serializers.standard import StandardSerializer
from servers import RedisServer


def _flip(path: Path) -> None:
    entry = parse_entry(path.read_bytes(), check_sections=False)
    offset, length, _ = entry.trailer.sections[-1]
    with open(path, "r+b") as f:
        f.seek(offset + length // 3)
        byte = f.read(1)
        f.seek(offset + length // 3)
        f.write(bytes([byte[0] ^ 0x08]))


def test_verify_finds_and_removes_a_flipped_bit(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "cache"
    backend = FileBackend(folder)
    calls: list[int] = []

    @arrowstash.cache(backend=backend, l1=False)
    def ramp(n: int) -> np.ndarray:
        calls.append(n)
        return np.arange(n, dtype=np.float64)

    for n in (1 << 18, 1 << 17, 10):  # 2 MiB and 1 MiB entries (mapped), and a small one
        ramp(n)
    _flip(Path(backend.path(ramp.cache_key(1 << 18))))
    url = f"file://{folder}"
    assert main(["verify", url, "--keep"]) == 1
    out = capsys.readouterr().out
    assert "3 entries checked" in out and "1 damaged" in out and "kept" in out
    assert "checksum mismatch" in out
    assert main(["verify", url]) == 1
    assert "removed" in capsys.readouterr().out
    assert main(["verify", url]) == 0
    assert "2 entries checked" in capsys.readouterr().out
    assert ramp(1 << 18)[-1] == (1 << 18) - 1 and calls.count(1 << 18) == 2  # recomputed
    assert ramp(1 << 17)[5] == 5.0 and calls.count(1 << 17) == 1  # the sound one kept


@pytest.mark.redis
def test_verify_with_a_secret_removes_forged_entries_from_redis(
        redis_factory: Callable[..., RedisServer], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ARROWSTASH_SECRET", "verify-secret")
    url = redis_factory().url  # a server of our own: verify scans the default prefix

    @arrowstash.cache(backend=url, l1=False)
    def label(n: int) -> str:
        return f"value {n}"

    for n in range(3):
        label(n)
    forged_key: Key = label.cache_key(1)
    client = redis.Redis.from_url(url)
    (name,) = [k for k in client.scan_iter("arrowstash:*") if forged_key.hex in k.decode()]
    encoded = StandardSerializer().encode("forged")  # checksums valid, no tag
    client.set(name, bytes(entry_bytes(forged_key, encoded, created=1.0, expires=None)))
    assert main(["verify", url]) == 1
    out = capsys.readouterr().out
    assert "3 entries checked" in out and "1 damaged" in out and "no valid signature" in out
    assert client.get(name) is None
    assert main(["verify", url]) == 0
    assert label(1) == "value 1" and label(0) == "value 0"
    client.close()
