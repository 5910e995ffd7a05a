"""The command's help and version: plain text (no reStructuredText, no doubled %), defaults
shown, the Avro codec named, and a quick start that loads no heavy library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from arrowstash.cli.main import main

COMMANDS = [[], ["demo"], ["bench"], ["info"], ["ls"], ["purge"], ["avro"], ["avro", "decode"],
            ["avro", "encode"], ["avro", "cat"], ["avro", "convert"], ["verify"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_help_is_plain_text(command: list[str], capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: arrowstash")
    assert "``" not in out and "%%" not in out and ":class:" not in out
    described = out.split("\n\n")[1]  # after the usage, what the command does
    assert not described.startswith(("positional", "options")), out
    assert max(len(line) for line in out.splitlines()) <= 80, out  # wrapped to the terminal


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 1000000)" in out and "(default: 5)" in out
    assert "(default: None)" not in out and "(default: False)" not in out


def test_version_names_the_avro_codec(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "Avro codec: native" in capsys.readouterr().out
    monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", "0")
    with pytest.raises(SystemExit):
        main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith("arrowstash 0.")
    assert "Avro codec: pure Python (ARROWSTASH_AVRO_NATIVE=0)" in out


def test_startup_loads_no_heavy_library() -> None:
    """``arrowstash --help`` stays quick: rich, pyarrow, NumPy load inside the commands."""
    code = ("import sys; from arrowstash.cli.main import parser; parser().format_help(); "
            "print(sorted(m for m in ('rich', 'numpy', 'pandas', 'matplotlib') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
