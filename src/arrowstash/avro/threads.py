"""How many threads a decode, an encode or a container-file read may use: one rule and one
error for all of them."""

from __future__ import annotations

from arrowstash import config


def thread_count(threads: int | None) -> int:
    """``threads``, checked, or every CPU this process may use when it is None."""
    if threads is None:
        return config.usable_cpus()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, not {threads!r}")
    return threads
