"""What the commands print: sizes and ages for people, and progress on long work."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def progress(items: Iterable[T], label: str) -> Iterator[T]:
    """Count items on stderr as they go by, when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    last = 0.0
    count = 0
    for count, item in enumerate(items, 1):
        now = time.monotonic()
        if now - last > 0.1:
            print(f"\r{label}: {count}", end="", file=sys.stderr, flush=True)
            last = now
        yield item
    print(f"\r{label}: {count} done", file=sys.stderr)
