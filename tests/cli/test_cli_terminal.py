"""On a terminal the command shows colour and progress bars; piped, neither (see test_cli)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arrowstash import FileBackend, cache

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")


def _on_a_terminal(*argv: str) -> tuple[int, str]:
    """Run the command with stdout and stderr on a pseudo-terminal; its exit code and screen."""
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "arrowstash", *argv],
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
