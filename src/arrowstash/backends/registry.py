"""Backends from URLs: the scheme names the class, imported only when a URL uses it."""

from __future__ import annotations

import difflib
import importlib
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from arrowstash import config
from arrowstash.backends._urls import (
    SCHEMES,
    colonless_scheme,
    known_schemes,
    local_path,
    redact,
    scheme_of,
)
from arrowstash.backends.base import Backend
from arrowstash.errors import BackendError


def backend_class(scheme: str) -> type:
    """The class serving ``scheme`` (a key of SCHEMES), imported now."""
    module, name, _extra = SCHEMES[scheme]
    cls: type = getattr(importlib.import_module(module), name)
    return cls


def from_url(url: str) -> Backend:
    """Build a backend from a URL: ``file:///path`` (or a bare path), ``memory://``,
    ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://h:p,h:p``, ``memcached://h:p``,
    ``s3://``, ``gs://``, ``az://``, ``objstore+memory://``, ``objstore+file://``.

    ``?encrypt=1`` on a file or network URL makes the backend encrypt every entry (as its
    ``encrypt=True``), so ``ARROWSTASH_URL`` alone can switch encryption on for a deployment.
    A mistyped scheme (``reddis://``, ``redis//host``) is an error naming the known ones, never
    a folder."""
    scheme = _checked_scheme(url)
    url, encrypt = _pop_encrypt(url)
    if scheme in ("", "file"):
        from arrowstash.backends.file import FileBackend

        return FileBackend(local_path(url), encrypt=encrypt)
    if scheme == "memory":
        from arrowstash.backends.memory import MemoryBackend

        if encrypt:
            raise ValueError("memory:// keeps entries in this process, unencrypted: "
                             "?encrypt= applies to file and network backends only")
        return MemoryBackend()
    backend: Backend = backend_class(scheme)(url, encrypt=encrypt)
    return backend


def _checked_scheme(url: str) -> str:
    """The scheme of ``url`` ("" for a path), which must be a known one."""
    known = known_schemes()
    scheme = scheme_of(url)
    lost = "" if scheme else colonless_scheme(url)
    if lost in known:
        fixed = f"{lost}://{url[len(lost) + 2:]}"
        raise ValueError(f"backend URL lacks the colon after {lost!r}: "
                         f"did you mean {redact(fixed)!r}?")
    if scheme in known and scheme != "file" and not url[len(scheme):].startswith("://"):
        raise ValueError(f"backend URL {redact(url)!r}: write {scheme}:// followed by "
                         "the address")
    if not scheme or scheme in known:
        return scheme
    close = difflib.get_close_matches(scheme, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}://? " if close else ""
    raise ValueError(f"backend URL {redact(url)!r}: unknown scheme {scheme!r} ({hint}known: "
                     f"{', '.join(s + '://' for s in known)}, or a plain path)")


def file_folder(url: str | None) -> Path | None:
    """The folder of the File backend ``url`` names (None: the default backend), found without
    creating it; None when the URL names another kind of backend."""
    if url is None:
        url = config.default_url()
        if url is None:
            return config.default_cache_dir()
    url, _encrypt = _pop_encrypt(url)
    if _checked_scheme(url) not in ("", "file"):
        return None
    return Path(local_path(url)).expanduser().absolute()


def opened(url: str | None) -> Backend:
    """The backend of ``url`` (None: the default) for a cached function: a store that cannot
    be reached or created (an unwritable folder) becomes an :class:`UnavailableBackend`, so
    decorating never fails on the environment; a malformed URL still raises here."""
    spec = url if url is not None else config.default_url()
    try:
        return from_url(spec) if spec is not None else default_backend()
    except BackendError as exc:
        from arrowstash.backends.file import FileBackend
        from arrowstash.backends.unavailable import UnavailableBackend

        clean, encrypt = _pop_encrypt(spec or "")
        scheme = _checked_scheme(clean)
        cls: Any = FileBackend if scheme in ("", "file") else backend_class(scheme)
        where = redact(clean) or str(config.default_cache_dir())
        return UnavailableBackend(where, exc, cls.capabilities, encrypt)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _pop_encrypt(url: str) -> tuple[str, bool]:
    """The URL without its ``encrypt`` query parameter, and that parameter's value.

    A bare path is a path, whatever characters it holds, so only URLs with a scheme have options.
    """
    parts = urlsplit(url)
    if not parts.scheme or not parts.query:
        return url, False
    query = parse_qsl(parts.query, keep_blank_values=True)
    values = [value for name, value in query if name == "encrypt"]
    if not values:
        return url, False
    if len(values) > 1 or values[0].lower() not in _TRUE + _FALSE:
        raise ValueError(f"backend URL: encrypt={','.join(values)!r} is not one of "
                         f"{', '.join(_TRUE + _FALSE)}")
    rest = urlencode([(name, value) for name, value in query if name != "encrypt"])
    return urlunsplit(parts._replace(query=rest)), values[0].lower() in _TRUE


def default_backend() -> Backend:
    """``ARROWSTASH_URL`` if set, else a File backend in the user's cache folder."""
    url = config.default_url()
    if url:
        return from_url(url)
    from arrowstash.backends.file import FileBackend

    return FileBackend(config.default_cache_dir())
