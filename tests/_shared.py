"""Where ../shared (files from other projects, read-only) lies: beside the project's root, or
beside the main checkout when the tests run in a git worktree."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shared() -> Path:
    here = ROOT.parent / "shared"
    if here.is_dir():
        return here
    try:
        common = subprocess.run(
            ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return here
    return Path(common).parent.parent / "shared"


SHARED = _shared()
SHARED_AVRO = SHARED / "avro"
