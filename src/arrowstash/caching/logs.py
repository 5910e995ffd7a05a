"""Log lines of cache events: one line each, structured fields, no key or value material, and
repeated failures rate-limited so that a dead backend cannot flood a service's logs.

Every line goes to the ``arrowstash.cache`` logger with these ``extra=`` fields: ``event`` (the
kind: ``corrupt_entry``, ``serialize``, ``backend_read``, ``backend_write``, ``backend_lock``,
``lock_timeout``, ``refresh``), ``function`` (module and qualified name), ``namespace``,
``backend`` (the backend's class name: never its URL, which may hold a password), ``key_hash``
(the first 12 hex digits of the key's hash, enough to correlate, "" when there is no key),
``error`` (the exception's class name) and ``suppressed`` (similar lines left out before this one).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from arrowstash.entry.format import Key

logger = logging.getLogger("arrowstash.cache")

#: A repeated event of one function (same kind, same topic) is logged at most once per this many
#: seconds; the next line after a quiet spell carries the count of those left out.
RATE_LIMIT_SECONDS = 60.0
KEY_HASH_DIGITS = 12


def backend_name(backend: Any) -> str:
    return "none" if backend is None else type(backend).__name__


class EventLog:
    """The log of one cached function: the fields every line carries, and the rate limiter."""

    def __init__(self, function: str, namespace: str, backend: Any) -> None:
        self.function = function
        self.namespace = namespace
        self.backend = backend_name(backend)
        self._last: dict[str, list[float]] = {}  # topic -> [time of its last line, suppressed]
        self._lock = threading.Lock()

    def event(
        self,
        event: str,
        message: str,
        *,
        key: Key | None = None,
        exc: BaseException | None = None,
        topic: str | None = None,
        level: int = logging.WARNING,
    ) -> None:
        """Log ``message`` (and ``exc``'s text) unless this function logged the same ``topic``
        (default: the event) less than RATE_LIMIT_SECONDS ago."""
        topic = topic or event
        now = time.monotonic()
        with self._lock:
            last = self._last.get(topic)
            if last is not None and now - last[0] < RATE_LIMIT_SECONDS:
                last[1] += 1
                return
            suppressed = int(last[1]) if last is not None else 0
            self._last[topic] = [now, 0]
        if not logger.isEnabledFor(level):
            return
        key_hash = key.hex[:KEY_HASH_DIGITS] if key is not None else ""
        text = message if exc is None else f"{message}: {exc}"
        if key is not None:  # e.g. a file path holding the whole hash: keep the prefix only
            text = text.replace(key.hex, key_hash + "…")
        if suppressed:
            text += f" ({suppressed} similar lines suppressed)"
        logger.log(
            level, "%s: %s", self.function, text,
            extra={
                "event": event, "function": self.function, "namespace": self.namespace,
                "backend": self.backend, "key_hash": key_hash,
                "error": type(exc).__name__ if exc is not None else "",
                "suppressed": suppressed,
            },
        )
