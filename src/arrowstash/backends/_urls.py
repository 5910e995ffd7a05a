"""Backend URLs without their secrets: what reprs, stats, errors, logs and the CLI may show.

A URL may carry a password (``redis://:pw@host``, ``redis://user:pw@host``) or a secret query
parameter (``?password=...``); nothing that leaves a backend object shows either. ``redact``
rewrites a URL for display; ``Scrubber`` removes a URL's secrets from any text, such as the
message of an exception a client library raised. The scheme helpers say what a backend string
names before any backend is made, so that a mistyped URL is refused instead of becoming a
folder (``redis//host`` once made ``./redis/host``).
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

HIDDEN = "***"
#: Query parameters whose values are secrets (compared without case).
SECRET_PARAMETERS = frozenset({
    "password", "pass", "passwd", "pwd", "secret", "token", "auth", "key", "apikey", "api_key",
    "access_key", "secret_key", "sasl_password", "credentials",
})
_PARAMETER = re.compile(r"(^|[?&])([^=&]*)=([^&#]*)")


def _hide_parameters(query: str) -> str:
    def hide(match: re.Match[str]) -> str:
        name = match.group(2)
        if unquote(name).lower() in SECRET_PARAMETERS and match.group(3):
            return f"{match.group(1)}{name}={HIDDEN}"
        return match.group(0)

    return _PARAMETER.sub(hide, query)


def redact(url: str) -> str:
    """``url`` with its password (or, without a ``user:`` part, its whole user info) and its
    secret query parameters replaced by ``***``; text that is not a URL is kept as it is unless
    it holds an ``@`` (user info, perhaps), which is then hidden too."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url if "@" not in url else HIDDEN
    netloc_end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
                     default=len(rest))
    netloc, tail = rest[:netloc_end], rest[netloc_end:]
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{HIDDEN}@{hosts}" if colon else f"{HIDDEN}@{hosts}"
    path, question, query = tail.partition("?")
    if question:
        query, hash_, fragment = query.partition("#")
        tail = f"{path}?{_hide_parameters(query)}{hash_}{fragment}"
    return f"{scheme}://{netloc}{tail}"


def secrets_of(url: str) -> list[str]:
    """The secret strings inside ``url`` (as written and percent-decoded), longest first."""
    found: set[str] = set()
    _, sep, rest = url.partition("://")
    if sep:
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        userinfo, at, _ = netloc.rpartition("@")
        if at:
            user, colon, password = userinfo.partition(":")
            found.update((password, unquote(password)) if colon else (user, unquote(user)))
        query = rest.partition("?")[2].partition("#")[0]
        for match in _PARAMETER.finditer(query):
            if unquote(match.group(2)).lower() in SECRET_PARAMETERS:
                found.update((match.group(3), unquote(match.group(3))))
    found.discard("")
    return sorted(found, key=len, reverse=True)


class Scrubber:
    """Removes one URL's secrets from text: made once per backend, applied to every message
    that may quote the URL or a client's view of it."""

    __slots__ = ("_secrets", "_shown", "_url")

    def __init__(self, url: str) -> None:
        self._url = url
        self._shown = redact(url)
        self._secrets = secrets_of(url)

    def __call__(self, text: str) -> str:
        if self._secrets:
            text = text.replace(self._url, self._shown)
            for secret in self._secrets:
                text = text.replace(secret, HIDDEN)
        return text


class Address(NamedTuple):
    host: str
    port: int


class Hosts(NamedTuple):
    """The parts of a URL naming several servers (``scheme://[user:pw@]h1:p1,h2:p2``)."""

    username: str | None
    password: str | None
    addresses: list[Address]


def split_hosts(url: str, scheme: str, default_port: int) -> Hosts:
    """The credentials and servers of a ``scheme://`` URL; ValueError (showing the URL
    redacted) if it is not one or a port is not a number."""
    parts = urlsplit(url)
    if parts.scheme != scheme:
        raise ValueError(f"not a {scheme} URL: {redact(url)!r}")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) if colon else None
    addresses = []
    for address in hosts.split(","):
        host, colon, port = address.rpartition(":")
        if not colon:
            host, port = address, ""
        if port and not port.isdigit():
            raise ValueError(f"{redact(url)!r}: port {port!r} of server {host!r} is not a number")
        addresses.append(Address(host.strip("[]") or "127.0.0.1",
                                 int(port) if port else default_port))
    return Hosts(username, password, addresses)


#: ``word:`` at the start: a URL scheme (one letter followed by ``:`` is a Windows drive).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")
#: ``word//`` at the start: a URL whose colon was lost.
_NO_COLON = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)//")


#: URL scheme -> (module, class, extra to install) of the network and object-store backends:
#: imported when a URL first uses the scheme, so that ``import arrowstash`` loads no client.
SCHEMES: dict[str, tuple[str, str, str]] = {
    "redis": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "rediss": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "unix": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "redis+cluster": ("arrowstash.backends.redis", "RedisBackend", "redis"),
    "memcached": ("arrowstash.backends.memcached", "MemcachedBackend", "memcached"),
    "s3": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "gs": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "az": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "objstore+memory": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
    "objstore+file": ("arrowstash.backends.object_store", "ObjectStoreBackend", "s3"),
}


def known_schemes() -> list[str]:
    """Every scheme ``from_url`` accepts."""
    return ["file", "memory", *SCHEMES]


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
    not a folder named ``redis:``; so is ``redis//h`` (a URL that lost its colon)."""
    scheme = scheme_of(text)
    lost = "" if scheme else colonless_scheme(text)
    if lost in known_schemes():  # ``redis//host`` would become the folders ./redis/host
        raise ValueError(f"FileBackend: {redact(text)!r} looks like a {lost}:// URL without its "
                         f"colon; write ./{redact(text)} if a folder is meant")
    if not scheme:
        return text
    if scheme != "file":
        raise ValueError(f"FileBackend takes a folder or a file:// URL, not a {scheme}:// URL "
                         f"({redact(text)!r}); arrowstash.backends.from_url builds the backend "
                         "a URL names")
    path = unquote(urlsplit(text).path)
    if not path:
        raise ValueError(f"backend URL {redact(text)!r} names no folder (write file:///path/to/cache)")
    return path
