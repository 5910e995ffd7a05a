"""A circuit breaker for network backends: stop calling a store that keeps failing."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from arrowstash.errors import BackendError


class Breaker:
    """Closed: calls go through. After ``failures`` consecutive failures it opens: calls fail at
    once, for ``cooldown`` seconds; then one probe call goes through and decides (success closes
    it, failure opens it again). Caching resumes by itself when the server comes back."""

    def __init__(self, failures: int = 5, cooldown: float = 5.0) -> None:
        if failures < 1 or cooldown < 0:
            raise ValueError("breaker needs failures >= 1 and cooldown >= 0")
        self.failures = failures
        self.cooldown = cooldown
        self._count = 0
        self._opened_at: float | None = None
        self._probing = False
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        return "half-open" if self._probing else "open"

    def before(self, where: str) -> None:
        """Raise BackendError without calling the store while the breaker is open."""
        if self._opened_at is None:
            return
        with self._lock:
            if self._opened_at is None:
                return
            if self._probing or time.monotonic() - self._opened_at < self.cooldown:
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
            if self._probing or self._count >= self.failures:
                self._opened_at = time.monotonic()
                self._probing = False

    @contextlib.contextmanager
    def guard(self, where: str, errors: tuple[type[BaseException], ...]) -> Iterator[None]:
        """The client boundary: ``errors`` become a BackendError naming ``where`` and count as
        failures; anything else means the server answered, so it counts as a success."""
        self.before(where)
        try:
            yield
        except errors as exc:
            self.failure()
            raise BackendError(f"{where} failed: {exc}") from exc
        except BaseException:
            self.success()  # the server answered; what it said was wrong
            raise
        self.success()
