"""A circuit breaker for network backends: stop calling a store that keeps failing.

A backend of several servers (a Redis Cluster) keeps one breaker per server, so that a dead
master costs its own keys a failure or two and then fast misses, while the live servers' keys
go on being served (and their successes do not keep the dead one's breaker closed).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from arrowstash.errors import BackendError

#: The states a breaker reports, best first.
STATES = ("closed", "half-open", "open")


def _keep(text: str) -> str:
    return text


class Breaker:
    """Closed: calls go through. After ``failures`` consecutive failures it opens: calls fail at
    once, for ``cooldown`` seconds; then one probe call goes through and decides (success closes
    it, failure opens it again). Caching resumes by itself when the server comes back.

    ``scrub`` removes secrets (a password of the backend's URL) from the messages of the
    errors it wraps. ``node(name)`` gives the breaker of one server of the store; those share
    this breaker's ``failures`` and ``cooldown``.
    """

    def __init__(self, failures: int = 5, cooldown: float = 5.0,
                 scrub: Callable[[str], str] = _keep) -> None:
        if failures < 1 or cooldown < 0:
            raise ValueError("breaker needs failures >= 1 and cooldown >= 0")
        self.failures = failures
        self.cooldown = cooldown
        self.scrub = scrub
        self._parent: Breaker | None = None
        self._nodes: dict[str, Breaker] = {}
        self._count = 0
        self._opened_at: float | None = None
        self._probing = False
        self._lock = threading.Lock()

    def node(self, name: str) -> Breaker:
        """The breaker of server ``name`` (made on first use)."""
        child = self._nodes.get(name)
        if child is None:
            with self._lock:
                child = self._nodes.get(name)
                if child is None:
                    child = Breaker(self.failures, self.cooldown, self.scrub)
                    child._parent = self
                    self._nodes[name] = child
        return child

    @property
    def _limits(self) -> tuple[int, float]:
        source = self._parent or self
        return source.failures, source.cooldown

    @property
    def own_state(self) -> str:
        if self._opened_at is None:
            return "closed"
        return "half-open" if self._probing else "open"

    @property
    def state(self) -> str:
        """The worst state of this breaker and its servers' breakers."""
        states = [self.own_state, *(child.own_state for child in list(self._nodes.values()))]
        return max(states, key=STATES.index)

    def open_nodes(self) -> list[str]:
        """The servers whose breakers are not closed."""
        return sorted(name for name, child in list(self._nodes.items())
                      if child.own_state != "closed")

    def before(self, where: str) -> None:
        """Raise BackendError without calling the store while the breaker is open."""
        if self._opened_at is None:
            return
        with self._lock:
            if self._opened_at is None:
                return
            if self._probing or time.monotonic() - self._opened_at < self._limits[1]:
                raise BackendError(f"{where}: circuit open after {self._count} failures")
            self._probing = True  # this call is the probe

    def success(self) -> None:
        if self._count or self._opened_at is not None:
            with self._lock:
                self._count = 0
                self._opened_at = None
                self._probing = False

    def failure(self) -> None:
        with self._lock:
            self._count += 1
            if self._probing or self._count >= self._limits[0]:
                self._opened_at = time.monotonic()
                self._probing = False

    @contextlib.contextmanager
    def guard(self, where: str, errors: tuple[type[BaseException], ...]) -> Iterator[None]:
        """The client boundary: ``errors`` become a BackendError naming ``where`` and count as
        failures; anything else means the server answered, so it counts as a success. A
        message that quoted a secret is scrubbed, and the client's exception is then not
        chained (its text would show the secret again)."""
        self.before(where)
        try:
            yield
        except errors as exc:
            self.failure()
            text = str(exc)
            shown = self.scrub(text)
            error = BackendError(f"{where} failed: {shown}")
            if shown != text:
                raise error from None
            raise error from exc
        except BaseException:
            self.success()  # the server answered; what it said was wrong
            raise
        self.success()
