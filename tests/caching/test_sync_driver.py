"""The sync driver: a hit is taken stage by stage without starting the call operation; whatever
else a call needs (a miss, a refresh to start) runs the operation's steps."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from arrowstash import MemoryBackend, cache
from arrowstash.caching import operations

OPERATIONS = Path(operations.__file__).resolve()


def functions_run(call: Callable[[], Any]) -> set[str]:
    """The names of the functions of ``caching/operations.py`` that ``call`` entered."""
    seen: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and Path(frame.f_code.co_filename).resolve() == OPERATIONS:
            seen.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_a_backend_hit_runs_no_operation_and_a_miss_runs_it() -> None:
    f = cache(backend=MemoryBackend(), l1=False)(lambda x: {"id": x})
    assert {"call", "miss", "store"} <= functions_run(lambda: f(1))
    assert functions_run(lambda: f(1)) == {"settled"}
    info = f.cache_info()
    assert (info.hits, info.l1_hits, info.misses) == (1, 0, 1)


def test_a_hit_with_a_refresh_policy_is_finished_by_the_operation() -> None:
    f = cache(backend=MemoryBackend(), l1=False, ttl=60, refresh_ahead=0.5)(lambda x: x)
    f(1)
    assert "call" in functions_run(lambda: f(1))
    assert f.cache_info().hits == 1
