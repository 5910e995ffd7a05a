"""Options are defined once: ``cache()``'s signature is held to the Options fields, and every
option is validated when the decorator is applied."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import sys
import typing
from pathlib import Path

import pytest

from arrowstash import FileBackend, MemoryBackend, cache
from arrowstash.caching.options import DEFAULT, NAMES, Options


def test_cache_signature_is_the_options() -> None:
    params = list(inspect.signature(cache).parameters.values())
    assert params[0].name == "func" and params[0].kind is inspect.Parameter.POSITIONAL_ONLY
    keyword = params[1:]
    assert tuple(p.name for p in keyword) == NAMES
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keyword)
    defaults = {f.name: f.default for f in dataclasses.fields(Options)}
    for p in keyword:
        assert p.default is defaults[p.name] or p.default == defaults[p.name], p.name


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.get_overloads is 3.11+")
def test_the_keyword_overload_names_the_same_options() -> None:
    overloads = typing.get_overloads(cache)
    keyword_forms = [o for o in overloads if "ttl" in inspect.signature(o).parameters]
    assert len(keyword_forms) == 1
    assert tuple(inspect.signature(keyword_forms[0]).parameters) == NAMES


@pytest.mark.parametrize("name", ["ttl", "stale_ttl", "lock_timeout", "refresh_ahead",
                                  "l1_max_entries", "l1_max_bytes"])
def test_every_number_option_refuses_a_bool(name: str) -> None:
    extra = {"ttl": 10} if name in ("stale_ttl", "refresh_ahead") else {}
    with pytest.raises((TypeError, ValueError), match=name):
        cache(backend=None, **extra, **{name: True})(lambda x: x)


@pytest.mark.parametrize("name", ["l1", "lock", "strict", "encrypt"])
def test_bool_options_refuse_other_values(name: str) -> None:
    with pytest.raises(TypeError, match=name):
        cache(backend=None, **{name: 1})(lambda x: x)


def test_normalised_once() -> None:
    options = Options(ttl=dt.timedelta(minutes=1), ignore="verbose", secret="s")
    assert options.ttl == 60.0
    assert options.ignore == ("verbose",)
    assert options.secret == b"s"
    assert Options().backend is DEFAULT
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.ttl = 5  # type: ignore[misc]


def test_stale_ttl_needs_a_ttl() -> None:
    with pytest.raises(ValueError, match="need a ttl"):
        Options(stale_ttl=5)


def test_backend_url_string_is_a_backend(tmp_path: Path) -> None:
    calls = []

    @cache(backend=f"file://{tmp_path / 'c'}")
    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    assert double(2) == double(2) == 4
    assert calls == [2]
    assert isinstance(double._core.backend, FileBackend)
    assert cache(backend="memory://")(lambda x: x)._core.backend.__class__ is MemoryBackend


def test_backend_of_another_type_is_refused_at_decoration() -> None:
    with pytest.raises(TypeError, match="backend must be"):
        cache(backend=42)(lambda x: x)  # type: ignore[call-overload]
