"""The examples in README.md and docs/ run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _examples() -> list[tuple[str, str]]:
    return [
        (f"{path.name}#{number}", code)
        for path in FILES
        for number, code in enumerate(BLOCK.findall(path.read_text()), 1)
    ]


def test_there_are_examples() -> None:
    assert len(_examples()) >= 5


@pytest.mark.parametrize(("where", "code"), _examples(), ids=[w for w, _ in _examples()])
def test_example_runs(
    where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the default backend stays in tmp
    monkeypatch.delenv("ARROWSTASH_URL", raising=False)
    exec(compile(code, where, "exec"), {"__name__": f"doc_{where.replace('#', '_')}"})
