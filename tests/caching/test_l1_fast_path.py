"""The L1 fast path: hits found by the positional arguments themselves, skipping the canonical
key. Every semantic of the canonical path must hold on it too: argument types, TTL, LRU bounds,
invalidation, independence of results, methods, keyword arguments."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import sys
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrowstash.caching.sync_shell
from arrowstash import MemoryBackend, cache
from arrowstash.caching.l1 import L1, L1Item, copier


class Calls:
    def __init__(self) -> None:
        self.args: list[Any] = []

    def __len__(self) -> int:
        return len(self.args)


class Color(enum.IntEnum):
    RED = 1


class Name(str, enum.Enum):
    A = "a"


def test_equal_arguments_of_other_types_are_other_keys() -> None:
    body = Calls()

    @cache(backend=None)
    def f(x: Any) -> str:
        body.args.append(x)
        return f"{type(x).__name__}:{x!r}"

    arguments = [1, 1.0, True, Color.RED, "a", Name.A, b"a", 0.0, -0.0, 0, False, None]
    for _ in range(3):  # compute, then two rounds of hits
        assert [f(x) for x in arguments] == [f"{type(x).__name__}:{x!r}" for x in arguments]
    assert len(body) == len(arguments)
    info = f.cache_info()
    assert (info.misses, info.hits, info.l1_hits) == (len(arguments), 2 * len(arguments),
                                                       2 * len(arguments))


def test_counters_and_sampled_latency_of_fast_hits() -> None:
    @cache(backend=None)
    def f(x: int) -> int:
        return x

    f(1)
    for _ in range(200):
        assert f(1) == 1
    info = f.cache_info()
    assert (info.hits, info.l1_hits, info.misses) == (200, 200, 1)
    assert 0 < info.mean_hit_latency < 1.0  # seconds: measured, not a default


def test_several_arguments_of_mixed_types() -> None:
    body = Calls()

    @cache(backend=None)
    def f(a: Any, b: Any, c: Any = None) -> tuple[Any, ...]:
        body.args.append((a, b, c))
        return (type(a), type(b), type(c))

    calls = [(1, "x"), (1.0, "x"), (1, "x", 2), (1, "x", 2.0), (True, "x", 2)]
    for _ in range(2):
        assert [f(*c) for c in calls] == [tuple(map(type, (*c, None)[:3])) for c in calls]
    assert len(body) == len(calls)


def test_keyword_forms_and_defaults_share_one_entry() -> None:
    body = Calls()

    @cache(backend=None)
    def f(a: int, b: int = 2) -> list[int]:
        body.args.append((a, b))
        return [a, b]

    forms = [lambda: f(1, 2), lambda: f(1, b=2), lambda: f(a=1, b=2), lambda: f(b=2, a=1),
             lambda: f(1)]
    for _ in range(3):
        for form in forms:
            assert form() == [1, 2]
    assert body.args == [(1, 2)]
    assert f.cache_info().l1_hits == 3 * len(forms) - 1


def test_unhashable_and_unusual_arguments_take_the_canonical_path() -> None:
    body = Calls()

    @cache(backend=None)
    def f(x: Any) -> int:
        body.args.append(x)
        return len(body)

    for value in ([1, 2], (1, (2.0, 3)), {"k": 1}, dt.date(2024, 1, 2), (1,), (1.0,)):
        first = f(value)
        assert f(value) == first
    assert len(body) == 6
    assert f([1, 2]) == 1 and f((1.0,)) == 6


def test_ttl_applies_to_fast_hits(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    monkeypatch.setattr(arrowstash.caching.sync_shell, "_now", lambda: clock[0])
    body = Calls()

    @cache(backend=None, ttl=10)
    def f(x: int) -> dict[str, int]:
        body.args.append(x)
        return {"n": len(body)}

    assert f(1) == {"n": 1}
    clock[0] += 9.9
    assert f(1) == {"n": 1}  # a fast hit, still fresh
    clock[0] += 0.2
    assert f(1) == {"n": 2}  # expired: recomputed
    assert f(1) == {"n": 2}
    assert f.cache_info().hits == 2


def test_lru_order_and_entry_bound_hold_for_fast_hits() -> None:
    body = Calls()

    @cache(backend=None, l1_max_entries=2)
    def f(x: int) -> list[int]:
        body.args.append(x)
        return [x]

    f(1)
    f(2)
    f(1)  # a fast hit makes 1 the most recently used...
    f(3)  # ...so this evicts 2
    assert f(1) == [1] and f(3) == [3]
    assert body.args == [1, 2, 3]
    f(2)
    assert body.args == [1, 2, 3, 2]
    l1 = f._core.l1  # type: ignore[attr-defined]
    assert len(l1) == 2
    assert {item.digest for _types, item in l1.fast.values()} <= set(l1.items)


def test_byte_bound_holds_for_fast_hits() -> None:
    @cache(backend=None, l1_max_bytes=120_000)
    def f(x: int) -> dict[str, bytes]:
        return {"blob": bytes(50_000)}

    for x in range(6):
        f(x)
        f(x)
    assert 1 <= f.cache_info().l1_entries <= 2
    assert len(f._core.l1.fast) <= 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("verb", ["invalidate", "invalidate_kw", "cache_clear", "refresh"])
def test_invalidation_reaches_the_fast_path(verb: str) -> None:
    body = Calls()

    @cache(backend=None)
    def f(x: int) -> list[int]:
        body.args.append(x)
        return [x, len(body)]

    assert f(1) == f(1) == [1, 1]
    if verb == "invalidate":
        f.invalidate(1)
    elif verb == "invalidate_kw":
        f.invalidate(x=1)
    elif verb == "cache_clear":
        f.cache_clear()
    else:
        assert f.refresh(1) == [1, 2]
    assert f(1) == [1, 2]
    assert f(1) == [1, 2]
    assert len(body) == 2


def test_fast_hits_are_independent_of_each_other_and_of_the_first_result() -> None:
    @cache(backend=None)
    def f(x: int) -> dict[str, Any]:
        return {"n": x, "tags": ["a", "b"], "deep": {"k": [1, {"s": {1, 2}}]}, "t": (1, "x")}

    expected = f.uncached(1)
    first = f(1)
    first["tags"].append("mutated")
    first["deep"]["k"][1]["s"].add(3)
    for _ in range(3):
        hit = f(1)
        assert hit == expected
        assert type(hit["t"]) is tuple and type(hit["deep"]["k"][1]["s"]) is set
        hit["tags"].clear()
        hit["deep"]["k"].append(0)
        hit["deep"]["k"][1]["s"].clear()
        hit["n"] = -1
    assert f.cache_info().l1_hits == 3


def test_values_too_big_for_a_copy_plan_are_still_independent() -> None:
    @cache(backend=None)
    def f(x: int) -> list[list[int]]:
        return [[i] for i in range(100)]  # more containers than a copy plan rebuilds

    f(1)
    hit = f(1)
    hit[0].append(99)
    assert f(1) == [[i] for i in range(100)]
    assert f.cache_info().l1_hits == 2


def test_methods_keep_their_semantics() -> None:
    body = Calls()

    @dataclasses.dataclass
    class Account:
        name: str

        @cache(backend=None)
        def balance(self, currency: str) -> dict[str, Any]:
            body.args.append((self.name, currency))
            return {"owner": self.name, "currency": currency}

    a, b = Account("a"), Account("b")
    for _ in range(2):
        assert a.balance("EUR") == {"owner": "a", "currency": "EUR"}
        assert b.balance("EUR") == {"owner": "b", "currency": "EUR"}
    a.balance.invalidate("EUR")
    assert a.balance("EUR")["owner"] == "a"
    assert body.args == [("a", "EUR"), ("b", "EUR"), ("a", "EUR")]
    assert Account.balance.cache_info().l1_hits == 2


def test_hits_through_a_backend_join_the_fast_path(memory_backend: MemoryBackend) -> None:
    body = Calls()

    @cache(backend=memory_backend)
    def f(x: int) -> list[int]:
        body.args.append(x)
        return [x]

    f(1)
    f._core.l1.clear()  # type: ignore[attr-defined]  # as if another process had stored it
    assert f(1) == [1]  # from the backend, back into L1
    assert f(1) == [1]  # from L1
    info = f.cache_info()
    assert (info.hits, info.l1_hits, info.misses) == (2, 1, 1)
    assert info.mean_hit_latency > 0


def test_fast_hits_race_evictions_from_other_threads() -> None:
    @cache(backend=None, l1_max_entries=8)
    def f(x: int) -> dict[str, Any]:
        return {"x": x, "l": [x] * 3}

    errors: list[BaseException] = []

    def hammer(offset: int) -> None:
        try:
            for i in range(3000):
                x = (i * 7 + offset) % 20
                assert f(x) == {"x": x, "l": [x] * 3}
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    l1 = f._core.l1  # type: ignore[attr-defined]
    assert len(l1) <= 8
    assert {item.digest for _types, item in l1.fast.values()} <= set(l1.items)


def test_eviction_races_the_lock_free_recency_update() -> None:
    # the fast path moves a hit's entry to the end of L1.items without the lock (as
    # CachedFunction._recency); evictions in put must not iterate items meanwhile. Threads
    # switch every microsecond here, which made the old eviction fail within 30,000 puts.
    l1 = L1(8, 1 << 30)
    errors: list[BaseException] = []

    def put() -> None:
        try:
            for i in range(30_000):
                l1.put(b"%d" % (i % 64), L1Item(0.0, 1, i, None))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def touch() -> None:
        move = l1.items.move_to_end
        for i in range(60_000):
            with contextlib.suppress(KeyError):
                move(b"%d" % (i % 64))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=put), threading.Thread(target=touch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(l1) == 8 and l1._bytes == 8


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
    st.binary(max_size=5), st.dates(), st.decimals(allow_nan=False),
)
hashables = st.recursive(scalars, lambda inner: st.tuples(inner, inner), max_leaves=4)
plain = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
        st.sets(hashables, max_size=4),
        st.tuples(hashables, hashables),
    ),
    max_leaves=20,
)


def _shape(value: Any) -> Any:
    """The value with its container types spelt out, to compare types as well as contents."""
    cls = type(value)
    if cls is dict:
        return (cls, [(k, _shape(v)) for k, v in value.items()])
    if cls in (list, tuple):
        return (cls, [_shape(v) for v in value])
    if cls in (set, frozenset):
        return (cls, sorted(map(repr, value)))
    return (cls, repr(value))


@settings(max_examples=200, deadline=None)
@given(plain)
def test_copy_plans_give_equal_independent_copies(value: Any) -> None:
    make = copier(value)
    if make is None:  # not a container, or too many of them: L1 decodes those instead
        return
    snapshot = _shape(value)
    first = make()
    assert _shape(first) == snapshot
    if type(value) is dict:
        value["added"] = 1  # the plan copied the original too
        first["other"] = 2
    elif type(value) is list:
        value.append(1)
        first.append(2)
    else:
        value.add(("added",))
        first.add(("other",))
    assert _shape(make()) == snapshot
