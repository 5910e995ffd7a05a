"""The options of ``@cache``, named, typed, defaulted, documented and validated here only.

``cache()``'s keyword arguments are these fields (a test holds the signature to them), and a
cached function keeps the validated ``Options`` it was decorated with: nothing downstream
re-checks or re-defaults an option.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arrowstash.backends.base import Backend
    from arrowstash.entry.crypto import KeySpec
    from arrowstash.serializers.base import Serializer


class _Default:
    def __repr__(self) -> str:
        return "<default backend>"


#: ``backend=DEFAULT`` (the default) means ``ARROWSTASH_URL`` or the user's cache folder;
#: ``backend=None`` means L1 only.
DEFAULT: Any = _Default()


@dataclass(frozen=True, kw_only=True)
class Options:
    """Every option of ``@cache`` (see docs/decorator.md for examples)."""

    #: Seconds (or a timedelta) an entry stays fresh; None: until evicted or cleared.
    ttl: float | None = None
    #: Groups entries: ``cache_clear`` and ``arrowstash purge --namespace`` act on one.
    namespace: str = "default"
    #: Part of every key: bump it to start afresh when the function's meaning changes.
    version: str | int | None = None
    #: A Backend, a URL (``file://``, ``redis://``...), ``None`` for L1 only, or DEFAULT.
    backend: Backend | str | None = DEFAULT
    #: "auto" (by the value's type), a serializer name, or a Serializer instance.
    serializer: str | Serializer = "auto"
    #: Keep results in this process too (an LRU bounded by entries and bytes).
    l1: bool = True
    l1_max_entries: int = 1024
    l1_max_bytes: int = 64 << 20
    #: A function of the call's arguments whose result replaces them in the key.
    key: Callable[..., Any] | None = None
    #: Parameters left out of the key (e.g. a logger or a verbosity flag).
    ignore: tuple[str, ...] = ()
    #: "track": keys hold a fingerprint of the function's code and of the helpers it reaches
    #: (docs/keys.md); "ignore": they do not (``version=`` is then the only code marker).
    code: str = "track"
    #: Stampede protection: one caller computes a key, the others wait for its value.
    lock: bool = True
    #: Seconds a caller waits for another's computation before computing anyway.
    lock_timeout: float = 60.0
    #: Raise serialization and backend failures instead of logging them and running uncached.
    strict: bool = False
    #: Signs every entry with a keyed MAC, and refuses (a logged miss) entries not signed with
    #: it: forged or foreign ones (default ``ARROWSTASH_SECRET``; docs/network-security.md).
    secret: bytes | None = None
    #: AES-256-GCM entries (None: as the backend says); see docs/encryption.md.
    encrypt: bool | None = None
    encryption_key: KeySpec | None = None
    #: Check every section of a memory-mapped hit (digests; MACs under a secret) before using
    #: it: O(size) instead of O(1), to catch bit flips on the disk.
    verify: bool = False
    #: Seconds past ``ttl`` during which a hit returns the old value and refreshes it.
    stale_ttl: float | None = None
    #: Fraction of ``ttl`` after which a hit starts a background refresh (e.g. 0.8).
    refresh_ahead: float | None = None

    def __repr__(self) -> str:
        """Every option, with ``secret``, ``encryption_key`` and a backend URL's password
        hidden (docs/network-security.md)."""
        from arrowstash.backends._urls import redact

        shown = []
        for name in NAMES:
            value = getattr(self, name)
            if name in ("secret", "encryption_key") and value is not None:
                value = "***"
            elif name == "backend" and isinstance(value, str):
                value = redact(value)
            shown.append(f"{name}={value!r}")
        return f"Options({', '.join(shown)})"

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place, once
        set_(self, "ttl", _seconds("ttl", self.ttl))
        set_(self, "stale_ttl", _seconds("stale_ttl", self.stale_ttl))
        if not isinstance(self.namespace, str) or not self.namespace:
            raise ValueError(f"namespace must be a non-empty string, not {self.namespace!r}")
        if self.version is not None and type(self.version) not in (str, int):
            raise TypeError(f"version must be a string, an int or None, not {self.version!r}")
        for name in ("l1_max_entries", "l1_max_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        lock_timeout = self.lock_timeout
        if not _is_number(lock_timeout) or lock_timeout < 0:
            raise ValueError(f"lock_timeout must be a number of seconds >= 0, not "
                             f"{lock_timeout!r}")
        if self.refresh_ahead is not None and (not _is_number(self.refresh_ahead)
                                               or not 0 < self.refresh_ahead < 1):
            raise ValueError(f"refresh_ahead must be a fraction of the ttl between 0 and 1 "
                             f"(e.g. 0.8), not {self.refresh_ahead!r}")
        if (self.stale_ttl is not None or self.refresh_ahead is not None) and self.ttl is None:
            raise ValueError("stale_ttl and refresh_ahead need a ttl: entries that never expire "
                             "are never stale")
        for name in ("l1", "lock", "strict", "verify"):
            if type(getattr(self, name)) is not bool:
                raise TypeError(f"{name} must be True or False, not {getattr(self, name)!r}")
        if self.encrypt is not None and type(self.encrypt) is not bool:
            raise TypeError(f"encrypt must be True, False or None, not {self.encrypt!r}")
        if self.code not in ("track", "ignore"):
            raise ValueError(f"code must be 'track' or 'ignore', not {self.code!r}")
        if self.key is not None and not callable(self.key):
            raise TypeError(f"key must be a function of the call's arguments, not {self.key!r}")
        ignore: Iterable[str] = self.ignore
        set_(self, "ignore", (ignore,) if isinstance(ignore, str) else tuple(ignore))
        if isinstance(self.secret, str):
            set_(self, "secret", self.secret.encode())


def _is_number(value: Any) -> bool:
    """int or float, and not bool: ``ttl=True`` is a mistake, not one second."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if not _is_number(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds (or a timedelta) or None, "
                         f"not {value!r}")
    return float(value)


#: The option names, in declaration order: ``cache()``'s keyword-only parameters.
NAMES = tuple(f.name for f in fields(Options))
