"""The serializer protocol, run against every serializer the registry knows: declared traits,
round trips through real entry bytes, refusals that name what was wrong, and damaged payloads
that fail with our own errors (and, through a cached function, are a miss)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from arrowstash import ArrowstashError, MemoryBackend, SerializationError, cache
from arrowstash.backends.base import Stored
from arrowstash.caching.pipeline import MISSING
from arrowstash.entry import Key
from arrowstash.entry.format import entry_bytes, materialize, parse_entry
from arrowstash.serializers import Serializer
from arrowstash.serializers.registry import REGISTRY


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"i": np.arange(40, dtype="int64"), "s": [f"v{i}" for i in range(40)],
                         "t": pd.date_range("2026-01-01", periods=40, tz="UTC")})


#: name -> (a value it stores, how to compare a round trip, a value it must refuse, and the
#: type its refusal must name)
CASES: dict[str, tuple[Callable[[], Any], Callable[[Any, Any], bool], Any, str]] = {
    "standard": (lambda: {"a": [1, 2.5, None], "d": dt.date(2026, 1, 2), "b": b"x"},
                 lambda a, b: a == b, object(), "object"),
    "arrays": (lambda: {"x": np.arange(10.0), "y": np.ones((2, 3), dtype="int8")},
               lambda a, b: all(np.array_equal(a[k], b[k]) for k in b), {"f": len},
               "builtin_function_or_method"),
    "buffers": (lambda: {"frame": _frame(), "n": 3},
                lambda a, b: a["frame"].equals(b["frame"]) and a["n"] == b["n"], lambda: 1,
                "function"),
    "arrow": (_frame, lambda a, b: a.equals(b), 42, "int"),
    "avro": (lambda: pa.table({"i": pa.array([1, 2, 3], pa.int64()), "s": ["a", "b", "c"]}),
             lambda a, b: a.cast(b.schema).equals(b), 42, "int"),
}


def test_every_registered_serializer_is_covered() -> None:
    assert set(CASES) == set(REGISTRY)


@pytest.fixture(params=sorted(CASES))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _make(name: str, remote: bool = False) -> Serializer:
    return REGISTRY[name]().for_backend(remote)


def _entry(serializer: Serializer, value: Any) -> tuple[Key, bytes]:
    key = Key("contract", f"tests.{serializer.name}", b"\x01" * 16)
    encoded = serializer.encode(value)
    if serializer.executes_code:
        encoded.sign_with = b"contract-secret"
    return key, bytes(entry_bytes(key, materialize(encoded), created=1.0, expires=None))


def test_declares_its_traits(name: str) -> None:
    serializer = _make(name)
    assert isinstance(serializer, Serializer)
    assert serializer.name == name
    assert type(serializer.executes_code) is bool
    assert type(serializer.mutable_results) is bool
    for remote in (False, True):
        assert serializer.for_backend(remote).name == name


def test_round_trip_through_entry_bytes(name: str) -> None:
    make, same, _, _ = CASES[name]
    for remote in (False, True):
        serializer = _make(name, remote)
        value = make()
        _, data = _entry(serializer, value)
        entry = parse_entry(memoryview(bytearray(data)))
        assert entry.serializer == name
        assert same(serializer.decode(entry.meta, entry.sections), value)


def test_refuses_what_it_cannot_store_with_a_clear_error(name: str) -> None:
    bad, named = CASES[name][2:]
    with pytest.raises(SerializationError, match=rf"\b{named}\b"):
        _make(name).encode(bad)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_sections_fail_with_our_errors(name: str, data: st.DataObject) -> None:
    """Straight to decode, bypassing the entry's digests: a truncated or altered section
    decodes to something or raises an ArrowstashError, never another exception."""
    serializer = _make(name)
    encoded = materialize(serializer.encode(CASES[name][0]()))
    sections = [bytearray(memoryview(s).cast("B")) for s in encoded.sections]
    if not sections:
        return
    index = data.draw(st.integers(0, len(sections) - 1))
    section = sections[index]
    if data.draw(st.booleans()) or not section:
        del section[data.draw(st.integers(0, len(section))):]
    else:
        at = data.draw(st.integers(0, len(section) - 1))
        section[at] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(ArrowstashError):
        serializer.decode(encoded.meta, [memoryview(s) for s in sections])


@pytest.mark.parametrize("cut", [1, 64, 0.5])
def test_a_truncated_entry_is_a_logged_miss(name: str, cut: float) -> None:
    serializer = _make(name)
    fn: Any = cache(backend=MemoryBackend(), serializer=serializer,
                    secret=b"contract-secret")(lambda: None)
    key, data = _entry(serializer, CASES[name][0]())
    keep = int(len(data) * cut) if isinstance(cut, float) else len(data) - cut
    value, _ = fn._core.load_entry(key, Stored(memoryview(bytearray(data[:keep]))), True)
    assert value is MISSING
    assert fn.cache_info().errors == 1


def test_a_damaged_pickle_asking_for_huge_memory_is_our_error() -> None:
    """Found by the test above: one flipped bit in a pickled frame's stream made pickle ask for
    more memory than the machine has; that is a damaged entry, not a MemoryError."""
    serializer = _make("buffers")
    encoded = materialize(serializer.encode(CASES["buffers"][0]()))
    stream = bytearray(memoryview(encoded.sections[0]).cast("B"))
    stream[198] ^= 1
    with contextlib.suppress(ArrowstashError):
        serializer.decode(encoded.meta, [memoryview(stream)])


@pytest.mark.parametrize("payload", [b"\xd4\x06\x00",  # a date of one byte
                                     b"\xc7\x01\x0c\xff",  # a complex of one byte
                                     b"\xd4\x08\x00"])  # a timedelta of one byte
def test_a_damaged_standard_extension_is_our_error(payload: bytes) -> None:
    """Found by the damaged-sections property test: an extension whose bytes are too short for
    its type (a date, a complex) raised struct.error past the pipeline."""
    with pytest.raises(ArrowstashError):
        _make("standard").decode(None, [memoryview(payload)])
