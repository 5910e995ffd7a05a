"""The ``arrowstash`` command against a real cache folder filled by ``@cache`` functions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arrowstash import FileBackend, cache
from arrowstash.cli.main import human_age, human_size, main

ENTRIES, ALPHA, BETA, EXPIRED = 5, 4, 1, 2


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder: namespace alpha holds 2 live and 2 expired entries, beta 1 live entry."""
    folder = tmp_path_factory.mktemp("cli-template") / "cache"
    backend = FileBackend(folder)

    @cache(backend=backend, namespace="alpha")
    def area(w: int, h: int) -> int:
        return w * h

    @cache(backend=backend, namespace="alpha", ttl=0.1)
    def fleeting(x: int) -> list[int]:
        return [x]

    @cache(backend=backend, namespace="beta")
    def label(x: int) -> str:
        return f"#{x}"

    area(1, 2)
    area(3, 4)
    fleeting(1)
    fleeting(2)
    label(1)
    time.sleep(0.15)
    return folder


@pytest.fixture
def folder(template: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(template, copy)
    return copy


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _count_entry_files(folder: Path) -> int:
    return len(list(folder.rglob("*.ast")))


@pytest.mark.parametrize("form", ["url", "path"])
def test_ls_lists_every_entry(
    folder: Path, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    target = f"file://{folder}" if form == "url" else str(folder)
    code, out, _ = _run(capsys, "ls", target)
    assert code == 0
    lines = out.strip().splitlines()
    header, rows, summary = lines[0], lines[1:-1], lines[-1]
    assert header.split()[:3] == ["namespace", "function", "key"]
    assert len(rows) == ENTRIES
    assert summary.startswith(f"{ENTRIES} entries")
    assert sum(row.startswith("alpha") for row in rows) == ALPHA
    assert sum(row.startswith("beta") for row in rows) == BETA
    assert sum(row.rstrip().endswith("expired") for row in rows) == EXPIRED
    assert sum(row.rstrip().endswith("never") for row in rows) == ENTRIES - EXPIRED
    assert sum("fleeting" in row for row in rows) == 2
    assert all("standard" in row for row in rows)


def test_ls_of_one_namespace(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "ls", str(folder), "--namespace", "beta")
    assert code == 0
    rows = out.strip().splitlines()[1:-1]
    assert len(rows) == 1 and rows[0].startswith("beta") and "label" in rows[0]
    assert out.strip().splitlines()[-1].startswith("1 entries")


def test_ls_uses_arrowstash_url_by_default(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWSTASH_URL", f"file://{folder}")
    code, out, _ = _run(capsys, "ls")
    assert code == 0
    assert out.strip().splitlines()[-1].startswith(f"{ENTRIES} entries")


def test_info_summarises(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path(folder / "alpha" / "junk.ast").write_bytes(b"not an entry")
    code, out, _ = _run(capsys, "info", f"file://{folder}")
    assert code == 0
    assert f"{ENTRIES} readable, {ENTRIES + 1} files" in out
    assert f"expired     {EXPIRED}" in out
    assert f"namespace   alpha: {ALPHA} entries" in out
    assert f"namespace   beta: {BETA} entries" in out
    assert f"standard: {ENTRIES}" in out
    assert str(folder) in out


def test_purge_expired(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "purge", str(folder), "--expired")
    assert (code, out.strip()) == (0, f"removed {EXPIRED} entries")
    assert _count_entry_files(folder) == ENTRIES - EXPIRED
    _, out, _ = _run(capsys, "ls", str(folder))
    assert "fleeting" not in out and "expired" not in out
    _, out, _ = _run(capsys, "purge", str(folder), "--expired")
    assert out.strip() == "removed 0 entries"


def test_purge_namespace(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "purge", f"file://{folder}", "--namespace", "alpha")
    assert (code, out.strip()) == (0, f"removed {ALPHA} entries")
    _, out, _ = _run(capsys, "ls", str(folder))
    rows = out.strip().splitlines()[1:-1]
    assert len(rows) == BETA and rows[0].startswith("beta")


def test_purge_all(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "purge", str(folder), "--all")
    assert (code, out.strip()) == (0, f"removed {ENTRIES} entries")
    assert _count_entry_files(folder) == 0
    assert FileBackend(folder).stats()["entries"] == 0


def test_purge_needs_to_be_told_what(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["purge", str(folder)])
    assert excinfo.value.code == 2
    assert _count_entry_files(folder) == ENTRIES
    with pytest.raises(SystemExit):
        main(["purge", str(folder), "--all", "--expired"])
    assert _count_entry_files(folder) == ENTRIES


def test_bad_url_is_an_error_exit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "ls", "bogus://nowhere")
    assert code == 2
    assert err.startswith("arrowstash: error:") and "bogus" in err
    assert out == ""


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main([])
    assert excinfo.value.code == 2


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (5 << 20, "5.0 MiB")]
)
def test_human_size(n: int, text: str) -> None:
    assert human_size(n) == text


@pytest.mark.parametrize(("s", "text"), [(5, "5s"), (90, "1.5m"), (7200, "2.0h"), (86400, "1.0d")])
def test_human_age(s: float, text: str) -> None:
    assert human_age(s) == text


@pytest.mark.slow
def test_demo_runs(tmp_path: Path) -> None:
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-m", "arrowstash", "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hit" in result.stdout
    assert str(tmp_path / "demo") in result.stdout


def test_info_shows_each_function(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "info", f"file://{folder}")
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("function    ")]
    assert len(lines) == 3
    fleeting = next(line for line in lines if ".fleeting:" in line)
    assert fleeting.startswith("function    alpha/") and ": 2 entries, " in fleeting
    assert ", 2 expired, newest " in fleeting


@pytest.mark.parametrize("kind", [pytest.param("redis", marks=pytest.mark.redis),
                                  pytest.param("redis_cluster", marks=pytest.mark.redis),
                                  pytest.param("memcached", marks=pytest.mark.memcached)])
def test_info_shows_the_server_counters(
    kind: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """The servers' own counters (of every client) include what these calls did."""
    from arrowstash import backends

    if kind == "redis_cluster":  # the session's cluster: its entries are cleared below
        server = request.getfixturevalue("redis_cluster")
    else:
        server = request.getfixturevalue(f"{kind}_factory")()
    backend = backends.from_url(server.url)

    @cache(backend=backend, l1=False)
    def f(x: int) -> int:
        return x

    for x in (1, 1, 1, 2):
        f(x)
    code, out, _ = _run(capsys, "info", server.url)
    assert code == 0
    [line] = [line for line in out.splitlines() if line.startswith("server      ")]
    counters = dict(part.rsplit(" ", 1) for part in line[12:].split(" (")[0].split(", ")
                    if not part.startswith("memory"))
    assert int(counters["hits"]) >= 2 and int(counters["misses"]) >= 2
    assert "breaker     closed" in out
    if kind != "memcached":  # memcached cannot list its keys
        assert f"function    default/{f._core.name}: 2 entries" in out  # type: ignore[attr-defined]
    else:
        assert int(counters["items"]) >= 2
    f.cache_clear()
    backend.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["file", pytest.param("redis", marks=pytest.mark.redis),
                                  pytest.param("memcached", marks=pytest.mark.memcached)])
def test_bench_times_each_value_and_leaves_nothing_behind(
    kind: str, folder: Path, request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str]
) -> None:
    from arrowstash import backends

    server = None if kind == "file" else request.getfixturevalue(f"{kind}_factory")()
    url = f"file://{folder}" if server is None else server.url
    before = [e.key for e in backends.from_url(url).entries()]
    code, out, _ = _run(capsys, "bench", url, "--rows", "5000", "--mib", "2", "--repeats", "2")
    assert code == 0, out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[3:] if line.strip()}
    assert set(rows) == {"small", "frame", "array"}
    serializers = {"small": "standard", "frame": "arrow", "array": "arrays"}
    for name, fields in rows.items():
        assert fields[-1] == "True"  # every hit gave the value back
        if kind != "memcached":  # memcached cannot list entries, so neither size nor serializer
            assert fields[1] == serializers[name]
    assert [e.key for e in backends.from_url(url).entries()] == before  # its namespace is gone


def test_bench_refuses_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "bench", "memory://", "--repeats", "0")
    assert code == 2 and "--repeats, --rows and --mib must be positive" in err
