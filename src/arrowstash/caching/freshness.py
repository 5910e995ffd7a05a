"""When a cached value is due for a background refresh: ``stale_ttl=`` and ``refresh_ahead=``.

An entry is fresh for ``ttl`` seconds after it was stored. With ``stale_ttl`` it is kept for
``ttl + stale_ttl`` (its header's ``expires`` and the backend's own expiry say so), and a hit in
the stale spell returns the old value at once while the function runs again in the background.
With ``refresh_ahead=0.8`` a hit past 80% of ``ttl`` starts that refresh before the value even
goes stale. Readers need no extra field in the entry: the refresh point is ``expires`` minus a
lead that follows from the function's own options.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arrowstash.caching.options import Options


@dataclass(frozen=True)
class Freshness:
    """The refresh policy of one function."""

    lifetime: float  # seconds an entry is kept: ttl + stale_ttl
    lead: float  # a hit this many seconds (or fewer) before the entry expires refreshes it
    _claimed: set[bytes] = field(default_factory=set, compare=False, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def of(cls, options: Options) -> Freshness | None:
        """The policy for these (validated) options; None when neither is set."""
        if options.stale_ttl is None and options.refresh_ahead is None:
            return None
        assert options.ttl is not None  # Options refuses stale_ttl or refresh_ahead without it
        lifetime = options.ttl + (options.stale_ttl or 0.0)
        return cls(lifetime, lifetime - options.ttl * (options.refresh_ahead or 1.0))

    def due(self, expires: float, now: float) -> bool:
        """Whether a value of an entry expiring at ``expires`` should be refreshed now."""
        return bool(expires) and expires - self.lead <= now

    def claim(self, digest: bytes) -> bool:
        """Take the in-process right to refresh a key; False while another refresh runs."""
        with self._guard:
            if digest in self._claimed:
                return False
            self._claimed.add(digest)
            return True

    def release(self, digest: bytes) -> None:
        with self._guard:
            self._claimed.discard(digest)
