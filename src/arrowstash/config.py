"""The one place where arrowstash reads its environment.

- ``ARROWSTASH_URL``: the default backend (``file:///path``, ``memory://``, ...).
- ``XDG_CACHE_HOME`` (or the platform's equivalent): where the default File backend lives.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def default_url() -> str | None:
    return os.environ.get("ARROWSTASH_URL") or None


def default_cache_dir() -> Path:
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "arrowstash"
