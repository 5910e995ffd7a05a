"""A backend URL's password never shows: not in reprs, stats, errors (ours or the client's, on a
wrong password too), logs nor the CLI's output. A real Redis server with ``requirepass``."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import arrowstash
from arrowstash import BackendError
from arrowstash.backends import from_url
from arrowstash.backends._urls import Scrubber, redact, secrets_of, split_hosts
from arrowstash.backends.memcached import MemcachedBackend
from arrowstash.backends.redis import RedisBackend
from arrowstash.cli.main import main
from servers import RedisServer, port_closed

PASSWORD = "Zq8-pw-u7Hx"
WRONG = "Wr0ng-pw-K2m"


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
    ("redis://user:pw@h:1/0", "redis://user:***@h:1/0"),
    ("rediss://tok@h/0", "rediss://***@h/0"),
    ("redis://h:1/0?password=pw&db=2", "redis://h:1/0?password=***&db=2"),
    ("unix://:pw@/tmp/r.sock?db=0", "unix://:***@/tmp/r.sock?db=0"),
    ("unix:///tmp/r.sock?db=0&Password=pw", "unix:///tmp/r.sock?db=0&Password=***"),
    ("redis+cluster://:pw@h1:1,h2:2", "redis+cluster://:***@h1:1,h2:2"),
    ("memcached://u:pw@h:11211", "memcached://u:***@h:11211"),
    ("redis://h:1/0", "redis://h:1/0"),
    ("/var/cache/x", "/var/cache/x"),
])
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


_secret = st.text(st.characters(codec="ascii", exclude_characters="@/?#&=%:\0 "), min_size=1,
                  max_size=20)


@given(_secret, _secret)
def test_redact_and_scrub_hide_any_password(user: str, password: str) -> None:
    url = f"redis://{user}:{password}@host:6379/0?token={password}x"
    assert redact(url) == f"redis://{user}:***@host:6379/0?token=***"
    assert f"{password}x" in secrets_of(url)
    text = f"failed at {url} with {password} and {password}x"
    assume(password not in f"failed at redis://:***@host:6379/0?token=*** with and {user}")
    assert password not in Scrubber(url)(text)


def test_split_hosts_reads_credentials_and_servers() -> None:
    hosts = split_hosts("redis+cluster://u:p%40ss@h1:7000,[::1]:7001,h3", "redis+cluster", 6379)
    assert (hosts.username, hosts.password) == ("u", "p@ss")
    assert [tuple(a) for a in hosts.addresses] == [("h1", 7000), ("::1", 7001), ("h3", 6379)]
    with pytest.raises(ValueError, match="is not a number") as caught:
        split_hosts("redis+cluster://:secretpw@h1:x7", "redis+cluster", 6379)
    assert "secretpw" not in str(caught.value)


@pytest.fixture
def locked_redis(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    server = redis_factory()
    server.cli("config", "set", "requirepass", PASSWORD)
    return server


def _url(server: RedisServer, password: str) -> str:
    return f"redis://:{password}@127.0.0.1:{server.port}/0"


def _chain(exc: BaseException) -> str:
    """Everything an exception shows: its traceback, causes and contexts included."""
    return "".join(traceback.format_exception(exc))


@pytest.mark.redis
def test_the_password_shows_nowhere(locked_redis: RedisServer, unique_prefix: str,
                                    caplog: pytest.LogCaptureFixture,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    url = _url(locked_redis, PASSWORD)
    backend = from_url(url)
    assert isinstance(backend, RedisBackend)

    @arrowstash.cache(backend=url, namespace=unique_prefix)
    def square(x: int) -> int:
        return x * x

    assert square(3) == 9 and square(3) == 9
    assert square.cache_info().hits == 1  # the password works: entries are stored and read
    shown = [repr(square), repr(backend), str(backend.stats()), repr(square._core.options),
             repr(arrowstash.caching.options.Options(backend=url, secret=b"s3", encryption_key=
                                                     "k" * 44))]
    with pytest.raises(ValueError) as refused:
        arrowstash.cache(backend=url, serializer="pickle")(lambda: None)
    shown.append(_chain(refused.value))
    assert main(["info", url]) == 0
    shown.append(capsys.readouterr().out)
    for text in shown:
        assert PASSWORD not in text, text
    assert "***" in repr(backend) and "***" in backend.stats()["url"]
    assert "s3" not in shown[4] and "kkkk" not in shown[4]


@pytest.mark.redis
def test_a_wrong_password_fails_without_showing_it(locked_redis: RedisServer,
                                                   unique_prefix: str,
                                                   caplog: pytest.LogCaptureFixture,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = _url(locked_redis, WRONG)
    backend = RedisBackend(url, prefix=unique_prefix)
    caplog.set_level(logging.DEBUG, logger="arrowstash")

    @arrowstash.cache(backend=backend, l1=False)
    def double(x: int) -> int:
        return 2 * x

    assert double(2) == 4  # the client's AuthenticationError is a logged failure
    assert double.cache_info().errors >= 1

    @arrowstash.cache(backend=backend, l1=False, strict=True)
    def strict(x: int) -> int:
        return x

    with pytest.raises(BackendError) as raised:
        strict(1)
    assert main(["info", url]) == 2
    out = capsys.readouterr()
    texts = [_chain(raised.value), caplog.text, out.out, out.err,
             *(str(r.__dict__) for r in caplog.records)]
    assert "auth" in (out.err + _chain(raised.value)).lower()  # the failure is still named
    for text in texts:
        assert WRONG not in text, text


@pytest.mark.redis
def test_cluster_and_bad_urls_keep_their_passwords(capsys: pytest.CaptureFixture[str]) -> None:
    port = port_closed()
    with pytest.raises(Exception) as raised:  # a cluster client connects at once: none there
        RedisBackend(f"redis+cluster://:{PASSWORD}@127.0.0.1:{port}", connect_timeout=0.2)
    assert PASSWORD not in _chain(raised.value)
    for url in (f"nosuch://:{PASSWORD}@h:1", f"redis://:{PASSWORD}@h:notaport/0"):
        with pytest.raises(ValueError) as bad:
            from_url(url)
        assert PASSWORD not in _chain(bad.value)
        assert main(["info", url]) == 2
        assert PASSWORD not in capsys.readouterr().err


@pytest.mark.memcached
def test_memcached_urls_take_no_credentials() -> None:
    with pytest.raises(ValueError, match="no user or password") as refused:
        MemcachedBackend(f"memcached://user:{PASSWORD}@127.0.0.1:11211")
    assert PASSWORD not in _chain(refused.value)
    port = port_closed()
    backend: Any = MemcachedBackend(f"memcached://127.0.0.1:{port}")
    assert repr(backend) == f"MemcachedBackend('memcached://127.0.0.1:{port}')"
