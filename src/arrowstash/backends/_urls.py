"""What a backend string names before any backend is made, so that a mistyped URL is refused
instead of becoming a folder (``redis//host`` once made ``./redis/host``)."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

#: ``word:`` at the start: a URL scheme (one letter followed by ``:`` is a Windows drive).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")
#: ``word//`` at the start: a URL whose colon was lost.
_NO_COLON = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)//")


def scheme_of(text: str) -> str:
    """The lower-case scheme of ``text``, or "" for a path (Windows drives included)."""
    match = _SCHEME.match(text)
    return match.group(1).lower() if match else ""


def colonless_scheme(text: str) -> str:
    """The word before a leading ``//`` (``redis//host`` -> "redis"), else ""."""
    match = _NO_COLON.match(text)
    return match.group(1).lower() if match else ""


def local_path(text: str) -> str:
    """The folder a FileBackend string names: a path, or a ``file://`` URL's path.

    A string with any other scheme is refused: ``FileBackend("redis://h:6379")`` is a mistake,
    not a folder named ``redis:``."""
    scheme = scheme_of(text)
    if not scheme:
        return text
    if scheme != "file":
        raise ValueError(f"FileBackend takes a folder or a file:// URL, not a {scheme}:// URL "
                         f"({redacted(text)!r}); arrowstash.backends.from_url builds the backend "
                         "a URL names")
    path = unquote(urlsplit(text).path)
    if not path:
        raise ValueError(f"backend URL {text!r} names no folder (write file:///path/to/cache)")
    return path


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: for errors and reprs."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
