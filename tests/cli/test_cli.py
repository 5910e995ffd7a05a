"""The ``arrowstash`` command against a real cache folder filled by ``@cache`` functions."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

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


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("form", ["url", "path"])
def test_ls_lists_every_entry(
    folder: Path, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    target = f"file://{folder}" if form == "url" else str(folder)
    rows = _json(capsys, "ls", target)
    assert len(rows) == ENTRIES
    assert sum(row["namespace"] == "alpha" for row in rows) == ALPHA
    assert sum(row["namespace"] == "beta" for row in rows) == BETA
    assert sum(row["expired"] for row in rows) == EXPIRED
    assert sum(row["expires"] == 0 for row in rows) == ENTRIES - EXPIRED
    assert sum(row["function"].endswith("fleeting") for row in rows) == 2
    assert {row["serializer"] for row in rows} == {"standard"}
    code, out, _ = _run(capsys, "ls", target)
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].split()[:3] == ["namespace", "function", "key"]
    assert len(lines) == ENTRIES + 2 and lines[-1].startswith(f"{ENTRIES} entries, ")
    assert sum(line.rstrip().endswith("expired") for line in lines) == EXPIRED
    assert "\x1b" not in out  # no colour when piped
    assert all(line == line.rstrip() for line in lines)  # and no padding after the last column


def test_ls_of_one_namespace_says_one_entry(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "ls", str(folder), "--namespace", "beta")
    assert code == 0
    rows = out.strip().splitlines()[1:-1]
    assert len(rows) == 1 and rows[0].startswith("beta") and "label" in rows[0]
    assert out.strip().splitlines()[-1].startswith("1 entry, ")


def test_ls_columns_stay_aligned_at_any_name_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = FileBackend(tmp_path)

    def f(x: int) -> int:
        return x

    for name in ("f", "a_function_name_well_past_forty_characters_long_" * 2):
        f.__qualname__ = name
        cache(backend=backend)(f)(1)
    _, out, _ = _run(capsys, "ls", str(tmp_path))
    header, *rows, _summary = out.splitlines()
    for column in (2, 3, 6):  # key, serializer, expires
        starts = {line.index(" " + line.split()[column]) for line in rows}
        assert len(starts) == 1, out
    assert header.index("key") == rows[0].index(rows[0].split()[2])


def test_ls_uses_arrowstash_url_by_default(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARROWSTASH_URL", f"file://{folder}")
    code, out, _ = _run(capsys, "ls")
    assert code == 0
    assert out.strip().splitlines()[-1].startswith(f"{ENTRIES} entries")


def test_info_summarises(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path(folder / "alpha" / "junk.ast").write_bytes(b"not an entry")
    info = _json(capsys, "info", f"file://{folder}")
    assert (info["entries"], info["files"], info["expired"]) == (ENTRIES, ENTRIES + 1, EXPIRED)
    assert info["serializers"] == {"standard": ENTRIES}
    assert str(folder) in info["backend"]
    assert info["avro_codec"] == "native"
    by_ns = Counter()
    for function in info["functions"]:
        by_ns[function["namespace"]] += function["entries"]
    assert by_ns == {"alpha": ALPHA, "beta": BETA}
    code, out, _ = _run(capsys, "info", f"file://{folder}")
    assert code == 0
    assert out.startswith("backend ")
    assert f"{ENTRIES} entries readable, {ENTRIES + 1} files" in out
    assert "avro codec   native" in out


@pytest.mark.parametrize("command", [["ls"], ["info"], ["purge", "--all"], ["verify"]])
def test_a_missing_folder_is_refused_and_not_created(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nothing-here"
    for target in (str(missing), f"file://{missing}"):
        code, out, err = _run(capsys, command[0], target, *command[1:])
        assert (code, out) == (1, "")
        assert f"no cache at {missing}" in err
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default location
    code, _, err = _run(capsys, *command)
    assert code == 1 and f"no cache at {tmp_path / 'xdg' / 'arrowstash'}" in err
    assert list(tmp_path.iterdir()) == []


def test_purge_expired(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "purge", str(folder), "--expired")
    assert (code, out.strip()) == (0, f"removed {EXPIRED} entries")
    assert _count_entry_files(folder) == ENTRIES - EXPIRED
    _, out, _ = _run(capsys, "ls", str(folder))
    assert "fleeting" not in out and "expired" not in out
    _, out, _ = _run(capsys, "purge", str(folder), "--expired")
    assert out.strip() == "removed 0 entries"


def test_purge_namespace(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "purge", str(folder), "--namespace", "")  # names none
    assert (code, out.strip()) == (0, "removed 0 entries")  # not the expired ones
    code, out, _ = _run(capsys, "purge", f"file://{folder}", "--namespace", "alpha")
    assert (code, out.strip()) == (0, f"removed {ALPHA} entries")
    code, out, _ = _run(capsys, "purge", f"file://{folder}", "--namespace", "beta")
    assert (code, out.strip()) == (0, "removed 1 entry")
    _, out, _ = _run(capsys, "ls", str(folder))
    assert out.strip() == "0 entries, 0 B"


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


def test_the_demo_names_a_command_that_runs_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arrowstash.cli.demo import _command

    spec = importlib.util.find_spec("arrowstash.__main__")  # found, not run
    assert spec is not None and spec.origin is not None
    main_module = spec.origin
    script = Path(sys.executable).parent / "arrowstash"  # as scripts/demo.sh runs it
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _command() == str(script)
    monkeypatch.setenv("PATH", str(script.parent))  # an activated venv
    assert _command() == "arrowstash"
    monkeypatch.setattr(sys, "argv", [main_module])  # python -m arrowstash
    assert _command() == f"{sys.executable} -m arrowstash"
    for argv in ([str(script)], [main_module]):
        monkeypatch.setattr(sys, "argv", argv)
        ran = subprocess.run([*shlex.split(_command()), "--version"], cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        assert ran.stdout.startswith("arrowstash ")


@pytest.mark.slow
def test_demo_keeps_its_folder_and_a_second_run_hits_disk(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    folder, chart = tmp_path / "demo", tmp_path / "demo.png"

    def demo(*extra: str) -> tuple[list[list[str]], str]:
        result = subprocess.run(
            [sys.executable, "-m", "arrowstash", "demo", "--dir", str(folder), *extra],
            capture_output=True, text=True, timeout=180, env=dict(os.environ),
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"arrowstash ls {folder}" in result.stdout and "compression none" in result.stdout
        jobs = [line.split() for line in result.stdout.splitlines()]
        return [line for line in jobs if line[-1:] == ["True"]], result.stdout

    first, out = demo("--plot", str(chart))
    assert len(first) == 3 and all("miss" in line for line in first)
    assert "run it again: the first calls are hits from disk" in out
    assert chart.read_bytes().startswith(b"\x89PNG")
    again, out = demo()  # a new process, the same folder
    assert len(again) == 3 and all("(disk)" in line for line in again)
    assert "run it again" not in out  # it was run again
    assert len(list(FileBackend(folder).entries("demo"))) == 3


def test_info_shows_each_function(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "info", f"file://{folder}")
    assert code == 0
    lines = [line.split() for line in out.splitlines() if line.startswith(("alpha ", "beta "))]
    assert len(lines) == 3
    [fleeting] = [line for line in lines if line[1].endswith(".fleeting")]
    assert fleeting[0] == "alpha" and fleeting[2] == "2"  # entries
    assert fleeting[5] == "2" and fleeting[-1] == "old"  # expired, newest ... old


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
    info = _json(capsys, "info", server.url)
    counters = info["server"]
    assert int(counters["hits"]) >= 2 and int(counters["misses"]) >= 2
    assert info["breaker"] == "closed"
    if kind != "memcached":  # memcached cannot list its keys
        [mine] = [x for x in info["functions"] if x["function"] == f._core.name]  # type: ignore[attr-defined]
        assert mine["entries"] == 2
    else:
        assert int(counters["items"]) >= 2
    code, out, _ = _run(capsys, "info", server.url)
    assert code == 0 and "breaker      closed" in out and "server " in out
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
    folders = sorted(p for p in folder.rglob("*") if p.is_dir())
    report = _json(capsys, "bench", url, "--rows", "5000", "--mib", "2", "--repeats", "2")
    rows = {row["value"]: row for row in report["results"]}
    assert set(rows) == {"small", "frame", "array"} and report["skipped"] == []
    serializers = {"small": "standard", "frame": "arrow", "array": "arrays"}
    for name, row in rows.items():
        assert row["same"] and row["hit"] > 0 and row["store"] > 0
        if kind != "memcached":  # memcached cannot list entries, so neither size nor serializer
            assert row["serializer"] == serializers[name] and row["bytes"] > 0
    assert [e.key for e in backends.from_url(url).entries()] == before  # its namespace is gone
    assert sorted(p for p in folder.rglob("*") if p.is_dir()) == folders  # and its folders


def test_bench_prints_what_it_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "bench", str(tmp_path / "new"), "--value", "small",
                        "--repeats", "1")
    assert code == 0
    assert "store: a miss through @cache (encode + write)" in out and "L1 off" in out
    [row] = [line.split() for line in out.splitlines() if line.startswith("small")]
    assert row[1] == "standard" and row[-1] == "True"
    assert list(tmp_path.iterdir()) == []  # the folder it created is gone too


def test_bench_draws_what_it_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    chart = tmp_path / "bench.png"
    code, out, _ = _run(capsys, "bench", str(tmp_path / "cache"), "--value", "small",
                        "--repeats", "1", "--plot", str(chart))
    assert code == 0 and f"chart: {chart}" in out
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert list(tmp_path.iterdir()) == [chart]


def test_bench_refuses_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "bench", "memory://", "--repeats", "0")
    assert code == 2 and "--repeats, --rows and --mib must be positive" in err


def test_brackets_in_names_and_values_are_printed_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def f(x: int) -> int:
        return x

    f.__qualname__ = "f[bold]"
    cache(backend=FileBackend(tmp_path), namespace="[red]ns")(f)(1)
    _, out, _ = _run(capsys, "ls", str(tmp_path))
    assert "[red]ns" in out and "f[bold]" in out


def test_a_missing_library_is_one_line_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)  # as if not installed
    code, out, _ = _run(capsys, "bench", str(tmp_path), "--value", "small", "--value", "array",
                        "--repeats", "1")
    assert code == 0 and "skipped array: needs numpy (pip install 'arrowstash[numpy]')" in out
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = _run(capsys, "bench", str(tmp_path / "b"), "--plot", str(tmp_path / "b.png"))
    assert (code, out) == (2, "") and not (tmp_path / "b").exists()  # refused before the work
    assert err == "arrowstash: bench needs matplotlib (pip install 'arrowstash[plot]')\n"
    from arrowstash.cli import demo

    monkeypatch.setattr(demo, "_jobs", demo._fallback_jobs)  # the quick job
    code, out, err = _run(capsys, "demo", "--plot", str(tmp_path / "x.png"))
    assert code == 2 and err == ("arrowstash: demo needs matplotlib "
                                 "(pip install 'arrowstash[plot]')\n")
