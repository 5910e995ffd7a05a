"""The backend protocol, run against every backend of the ``backend`` fixture: File, Memory,
Redis (standalone and Cluster, on real servers) and Memcached (a real server).

Memcached cannot do everything the others do, as its backend documents: it cannot list its keys
(``entries()`` is empty and ``stats()`` counts nothing), and ``clear`` bumps a generation instead
of deleting, so it needs a namespace and cannot say how many entries it hid (it returns 0). Those
differences are capability checks below, asserted both ways: a backend that claims to list must
list exactly, one that cannot must show nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from arrowstash import Backend, FileBackend, Key, MemoryBackend, StandardSerializer
from arrowstash.backends import EntryInfo, Stored, from_url
from arrowstash.backends.base import Held
from arrowstash.entry.format import Encoded, EntryWriter, parse_entry

SER = StandardSerializer()


def _key(n: int = 0, namespace: str = "ns", function: str = "mod.fn") -> Key:
    return Key(namespace, function, n.to_bytes(16, "big"))


def _put(backend: Backend, key: Key, value: object, expires: float | None = None) -> int:
    return backend.set(EntryWriter(key, SER.encode(value), time.time(), expires))


def can_list(backend: Backend) -> bool:
    """Whether ``entries()``/``stats()`` see the stored entries (all but Memcached)."""
    return backend.capabilities.lists_entries


def clear_counts(backend: Backend) -> bool:
    """Whether ``clear`` deletes and counts, and may be called without a namespace."""
    return backend.capabilities.lists_entries


def _value(backend: Backend, key: Key) -> object:
    stored = backend.get(key)
    assert stored is not None
    entry = parse_entry(stored.data)
    assert entry.key == key
    return SER.decode(entry.meta, entry.sections)


def test_satisfies_the_protocol(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert isinstance(backend.capabilities.shared, bool)
    assert isinstance(backend.encrypt, bool)


def test_a_declared_breaker_reports_its_state(backend: Backend) -> None:
    """Metrics read ``breaker.state`` of a backend declaring one, without probing for it."""
    if not backend.capabilities.breaker:
        assert "breaker" not in vars(backend)
        return
    assert backend.breaker.state == "closed"  # type: ignore[attr-defined]


def test_get_of_a_missing_key_is_none(backend: Backend) -> None:
    assert backend.get(_key()) is None


def test_set_then_get(backend: Backend) -> None:
    key = _key()
    size = _put(backend, key, {"a": [1, 2, 3]})
    stored = backend.get(key)
    assert isinstance(stored, Stored)
    assert stored.data.nbytes == size
    assert _value(backend, key) == {"a": [1, 2, 3]}


def test_set_overwrites(backend: Backend) -> None:
    key = _key()
    _put(backend, key, "old")
    _put(backend, key, "new")
    assert _value(backend, key) == "new"
    assert backend.stats()["entries"] == (1 if can_list(backend) else 0)


def test_streamed_sections_are_stored(backend: Backend) -> None:
    key = _key()

    def streamed(out: object) -> None:
        out.write(b"abc")  # type: ignore[attr-defined]
        out.write(b"def")  # type: ignore[attr-defined]

    backend.set(EntryWriter(key, Encoded("raw", {"m": 1}, [streamed, b"xyz"]), 1.0, None))
    stored = backend.get(key)
    assert stored is not None
    entry = parse_entry(stored.data)
    assert [bytes(s) for s in entry.sections] == [b"abcdef", b"xyz"]
    assert (entry.serializer, entry.meta, entry.header.created) == ("raw", {"m": 1}, 1.0)


def test_keys_differ_by_namespace_function_and_digest(backend: Backend) -> None:
    keys = [_key(1), _key(2), _key(1, namespace="other"), _key(1, function="mod.other")]
    for index, key in enumerate(keys):
        _put(backend, key, index)
    assert [_value(backend, key) for key in keys] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "name", ["a/b", "a_b", "..", ".", "../../escape", "/abs", "é ☃", "x" * 300, "a\0b", "CON"]
)
def test_awkward_names_are_stored_apart(backend: Backend, name: str) -> None:
    plain = _key(1, namespace="a_b", function="f")
    awkward = _key(1, namespace=name, function=name)
    _put(backend, plain, "plain")
    _put(backend, awkward, "awkward")
    assert _value(backend, awkward) == "awkward"
    assert _value(backend, plain) == "plain" or name == "a_b"
    assert {e.namespace for e in backend.entries()} == ({"a_b", name} if can_list(backend)
                                                         else set())
    if isinstance(backend, FileBackend):
        assert Path(backend.path(awkward)).resolve().is_relative_to(backend.directory.resolve())


def test_delete(backend: Backend) -> None:
    key = _key()
    _put(backend, key, 1)
    assert backend.delete(key) is True
    assert backend.get(key) is None
    assert backend.delete(key) is False


def test_clear_by_namespace_and_function(backend: Backend) -> None:
    keys = {
        "ns-f": _key(1, "ns", "f"),
        "ns-f2": _key(2, "ns", "f"),
        "ns-g": _key(1, "ns", "g"),
        "other-f": _key(1, "other", "f"),
    }
    for key in keys.values():
        _put(backend, key, 0)
    counts = clear_counts(backend)
    assert backend.clear("ns", "f") == (2 if counts else 0)
    assert backend.get(keys["ns-f"]) is None and backend.get(keys["ns-f2"]) is None
    assert backend.get(keys["ns-g"]) is not None
    assert backend.clear("ns") == (1 if counts else 0)
    assert backend.get(keys["ns-g"]) is None
    assert backend.get(keys["other-f"]) is not None
    assert backend.clear("nothing-here") == 0
    _put(backend, keys["ns-f"], 0)
    assert backend.get(keys["ns-f"]) is not None  # a cleared namespace takes new entries
    if counts:
        assert backend.clear() == 2
        assert backend.stats()["entries"] == 0
    else:
        with pytest.raises(ValueError, match="needs a namespace"):
            backend.clear()
        assert backend.get(keys["other-f"]) is not None  # the refused clear touched nothing
        backend.clear("ns")
        backend.clear("other")
    assert backend.get(keys["ns-f"]) is None and backend.get(keys["other-f"]) is None


def test_entries_describe_what_is_stored(backend: Backend) -> None:
    before = time.time()
    size = _put(backend, _key(1), "one", expires=before + 100)
    _put(backend, _key(2, namespace="other"), "two")
    if not can_list(backend):
        assert list(backend.entries()) == [] and list(backend.entries("other")) == []
        assert _value(backend, _key(2, namespace="other")) == "two"  # stored, just not listed
        return
    listed = sorted(backend.entries(), key=lambda e: e.namespace)
    assert [e.namespace for e in listed] == ["ns", "other"]
    first = listed[0]
    assert isinstance(first, EntryInfo)
    assert first.function == "mod.fn"
    assert first.key == _key(1).hex
    assert first.serializer == "standard"
    assert first.size == size
    assert before - 1 <= first.created <= time.time()
    assert first.expires == pytest.approx(before + 100, abs=1)
    assert listed[1].expires == 0.0
    assert first.location
    assert [e.namespace for e in backend.entries("other")] == ["other"]
    assert list(backend.entries("none")) == []


def test_stats_count_entries_and_bytes(backend: Backend) -> None:
    assert backend.stats()["entries"] == 0
    sizes = [_put(backend, _key(n), "x" * n) for n in range(3)]
    stats = backend.stats()
    if can_list(backend):
        assert stats["entries"] == 3
        assert stats["bytes"] == sum(sizes)
    else:
        assert (stats["entries"], stats["bytes"]) == (0, 0)
        assert [_value(backend, _key(n)) for n in range(3)] == ["", "x", "xx"]
    assert isinstance(stats["backend"], str)


def test_expired_entries_are_never_served_as_live(backend: Backend) -> None:
    key = _key()
    _put(backend, key, "stale", expires=time.time() - 1)
    stored = backend.get(key)
    # A backend may drop it (memory) or return it for the reader to check (file).
    assert stored is None or parse_entry(stored.data).header.expired(time.time())


def test_lock_is_a_context_manager_that_is_acquired(backend: Backend) -> None:
    with backend.lock(_key(), timeout=1.0) as held:
        assert held is Held.FREE
    with backend.lock(_key(), timeout=1.0) as held:  # released: can be taken again
        assert held is Held.FREE


def test_a_held_lock_makes_others_wait_then_give_up(backend: Backend) -> None:
    with backend.lock(_key(), timeout=1.0) as held:
        assert held is Held.FREE
        if isinstance(backend, MemoryBackend):
            # in-process only: the decorator already serialises this process's callers
            with backend.lock(_key(), timeout=0.1) as again:
                assert again is Held.FREE
            return
        started = time.monotonic()
        with backend.lock(_key(), timeout=0.2) as second:
            assert second is Held.TIMEOUT
        assert time.monotonic() - started >= 0.2
        with backend.lock(_key(1), timeout=0.2) as other_key:
            assert other_key is Held.FREE


# -- URLs ---------------------------------------------------------------------------------------


def test_from_url(tmp_path: Path) -> None:
    by_url = from_url(f"file://{tmp_path}/a")
    assert isinstance(by_url, FileBackend) and by_url.directory == tmp_path / "a"
    bare = from_url(str(tmp_path / "b"))
    assert isinstance(bare, FileBackend) and bare.directory == tmp_path / "b"
    quoted = from_url(f"file://{tmp_path}/with%20space")
    assert isinstance(quoted, FileBackend) and quoted.directory == tmp_path / "with space"
    assert isinstance(from_url("memory://"), MemoryBackend)


def test_from_url_encrypt_option(tmp_path: Path) -> None:
    assert from_url(f"file://{tmp_path}/a?encrypt=1").encrypt is True
    assert from_url(f"file://{tmp_path}/a?encrypt=off").encrypt is False
    assert from_url(f"file://{tmp_path}/a").encrypt is False
    # a bare path is a path, whatever it holds
    odd = from_url(f"{tmp_path}/b?encrypt=1")
    assert isinstance(odd, FileBackend) and odd.directory.name == "b?encrypt=1"
    assert odd.encrypt is False


@pytest.mark.parametrize("url, message", [
    ("file:///tmp/x?encrypt=maybe", "encrypt='maybe' is not one of"),
    ("file:///tmp/x?encrypt=1&encrypt=0", "encrypt='1,0' is not one of"),
    ("memory://?encrypt=1", "applies to file and network backends only"),
])
def test_from_url_refuses_bad_encrypt_options(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_url(url)


@pytest.mark.parametrize("url", ["file://", "nope://x", "ftp://host/path"])
def test_from_url_refuses(url: str) -> None:
    with pytest.raises(ValueError):
        from_url(url)
