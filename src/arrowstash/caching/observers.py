"""Hooks the pipeline calls on backend hits, misses and stores, for metrics and the like.

A cached function holds at most one observer; with none (the default) each hook site costs one
attribute test. Observers are attached to every live cached function, present and future, by
:func:`observe`, so an exporter (``arrowstash.metrics``) never patches the pipeline.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Protocol


class Observer(Protocol):
    """Latencies of one cached function, in seconds."""

    def backend_hit(self, seconds: float) -> None:
        """A hit served by the backend (L1 hits are counted, not timed one by one)."""

    def miss(self, seconds: float) -> None:
        """A call that ran the function, from its start to the stored value."""

    def stored(self, seconds: float) -> None:
        """Serializing and storing one result (sync and async functions alike)."""


class Observed(Protocol):
    """A cached function's pipeline, as observers see it: the slot they are attached to."""

    observer: Observer | None


_live: weakref.WeakSet[Observed] = weakref.WeakSet()
_factory: Callable[[], Observer] | None = None
_lock = threading.Lock()


def register(core: Observed) -> None:
    """Called once per new cached function: it joins the live ones and gets an observer if
    one is being attached."""
    with _lock:
        _live.add(core)
        if _factory is not None:
            core.observer = _factory()


def observe(factory: Callable[[], Observer] | None) -> None:
    """Give every live and future cached function an observer made by ``factory`` (one each);
    ``None`` removes them. Functions that already have one keep it."""
    global _factory
    with _lock:
        _factory = factory
        for core in list(_live):
            if factory is None:
                core.observer = None
            elif core.observer is None:
                core.observer = factory()


def live() -> list[Observed]:
    """The cached functions of this process that are still referenced."""
    with _lock:
        return list(_live)
