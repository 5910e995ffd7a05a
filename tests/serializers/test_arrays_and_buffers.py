"""The "arrays" (pickle-free) and "buffers" (pickle protocol 5) serializers, end to end.

Round trips of every plain dtype and memory layout, what "auto" sends where, writable and
independent loads, zero-copy hits and peak memory, out-of-band pickle sections, HMAC signing and
tampering, and the rules of shared backends. Everything runs on real files in ``tmp_path``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowstash import (
    ArraySerializer,
    BufferSerializer,
    CachedFunction,
    FileBackend,
    Key,
    MemoryBackend,
    SerializationError,
    cache,
)
from arrowstash.entry.format import FLAG_SIGNED, Entry, entry_bytes, parse_entry, read_header

LOGGER = "arrowstash.cache"
KEY = Key("tests", "arrays_and_buffers", bytes(range(16)))
DTYPES = [
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128", "bool",
    "datetime64[D]", "datetime64[ns]", "timedelta64[s]", "S5", "U3",
]


# -- helpers ------------------------------------------------------------------------------------


def sample(dtype: str, shape: tuple[int, ...] = (4, 6)) -> np.ndarray:
    """A C-contiguous array of ``dtype`` with distinct values (and NaN/NaT where there are)."""
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    i = np.arange(n)
    if dt.kind == "b":
        values: np.ndarray = i % 3 == 0
    elif dt.kind in "iu":
        values = (i * 37 - 5).astype(dt)  # wraps around for the unsigned and small types
    elif dt.kind == "f":
        values = np.linspace(-3.0, 3.0, n).astype(dt)
        values[1], values[2] = np.nan, -np.inf
    elif dt.kind == "c":
        values = (np.linspace(-3.0, 3.0, n) + 1j * i).astype(dt)
    elif dt.kind == "M":
        values = (np.datetime64("2024-02-29T23:59:59", "s") + i * 86_399).astype(dt)
        values[3] = np.datetime64("NaT")
    elif dt.kind == "m":
        values = (i * 7 - 3).astype(dt)
        values[3] = np.timedelta64("NaT")
    elif dt.kind == "S":
        values = np.array([f"b{j * 977}".encode() for j in range(n)], dtype=dt)
    else:
        values = np.array(["", "a", "\u03b1\u03b2", "xyz"] * n, dtype=dt)[:n]
    return values.reshape(shape)


LAYOUTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "C": lambda a: a,
    "F": np.asfortranarray,
    "F-columns": lambda a: np.asfortranarray(a)[:, 1:4],  # a slice that stays F-contiguous
    "step": lambda a: a[::2],  # non-contiguous
    "transposed-slice": lambda a: a[:, ::2].T,  # non-contiguous, transposed
    "reversed-3d": lambda a: a.reshape(2, 3, 4)[:, ::-1].transpose(2, 0, 1),
    "0-d": lambda a: a[1, 2, ...],
    "empty": lambda a: a[:0],
    "empty-3d-F": lambda a: np.asfortranarray(a.reshape(2, 3, 4)[:, :0]),
}


def assert_same_array(got: Any, want: np.ndarray) -> None:
    """Same dtype (byte order included), shape and bytes; F stays F, everything else comes back
    C-contiguous (non-contiguous views are made contiguous once)."""
    assert type(got) is np.ndarray
    assert got.dtype == want.dtype and got.dtype.str == want.dtype.str
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()  # exact bits: NaN payloads, NaT, -0.0
    if want.flags.c_contiguous:
        assert got.flags.c_contiguous
    elif want.flags.f_contiguous:
        assert got.flags.f_contiguous and not got.flags.c_contiguous
    else:
        assert got.flags.c_contiguous


def assert_same_tree(got: Any, want: Any) -> None:
    if isinstance(want, np.ndarray):
        assert_same_array(got, want)
    elif type(want) in (list, tuple):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same_tree(g, w)
    elif type(want) is dict:
        assert type(got) is dict and list(got) == list(want)
        for k in want:
            assert_same_tree(got[k], want[k])
    else:
        assert type(got) is type(want) and got == want


def round_trip(value: Any, serializer: Any = None) -> tuple[Any, Entry]:
    """encode -> entry_bytes -> parse_entry -> decode, no backend involved."""
    serializer = serializer if serializer is not None else ArraySerializer()
    encoded = serializer.encode(value)
    raw = entry_bytes(KEY, encoded, created=time.time(), expires=None)
    entry = parse_entry(raw)
    assert entry.serializer == serializer.name
    return serializer.decode(entry.meta, entry.sections), entry


def serializer_of(backend: Any, cached: CachedFunction, *args: Any) -> str:
    """The serializer recorded in the stored entry of ``cached(*args)``."""
    wanted = cached.cache_key(*args).hex
    found = [e.serializer for e in backend.entries() if e.key == wanted]
    assert len(found) == 1, f"no single entry for {args}"
    return found[0]


def entry_path(backend: FileBackend, cached: CachedFunction, *args: Any) -> Path:
    path = Path(backend.path(cached.cache_key(*args)))
    assert path.is_file()
    return path


def address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


class Model:
    """sklearn-like: fitted arrays in ``*_`` attributes, and constructor parameters."""

    def __init__(self, alpha: float = 1.0, coef_size: int = 1000) -> None:
        self.alpha = alpha
        self.params = {"alpha": alpha, "fit_intercept": True, "solver": "auto"}
        self.coef_ = np.linspace(0.0, 1.0, coef_size)
        self.intercept_ = np.float64(0.5)
        self.n_features_in_ = coef_size


class Holder:
    """A plain object holding arrays."""

    def __init__(self, **parts: Any) -> None:
        self.__dict__.update(parts)


#: Appended to whenever a Tracked object is unpickled: proves whether an entry was unpickled.
UNPICKLED: list[int] = []


class Tracked:
    def __init__(self, n: int) -> None:
        self.n = n
        self.payload = np.arange(n * 1000, dtype=np.float64)  # out-of-band section

    def __setstate__(self, state: dict[str, Any]) -> None:
        UNPICKLED.append(state["n"])
        self.__dict__.update(state)


# -- 1. round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_direct_round_trip_every_dtype_and_layout(dtype: str, layout: str) -> None:
    want = LAYOUTS[layout](sample(dtype))
    got, entry = round_trip(want)
    assert_same_array(got, want)
    assert got.flags.writeable  # entry_bytes gives a bytearray: the views are writable
    assert len(entry.sections) == 2  # the MessagePack container and the array's bytes


def test_layout_table_covers_what_it_claims() -> None:
    a = sample("float64")
    assert LAYOUTS["F"](a).flags.f_contiguous and not LAYOUTS["F"](a).flags.c_contiguous
    assert LAYOUTS["F-columns"](a).flags.f_contiguous
    assert not LAYOUTS["F-columns"](a).flags.c_contiguous
    for name in ("step", "transposed-slice", "reversed-3d"):
        view = LAYOUTS[name](a)
        assert not view.flags.c_contiguous and not view.flags.f_contiguous, name
    assert LAYOUTS["0-d"](a).ndim == 0
    assert LAYOUTS["empty"](a).size == 0 and LAYOUTS["empty-3d-F"](a).size == 0


@pytest.mark.parametrize("mmap_threshold", [64, None], ids=["mapped", "read-in"])
def test_cached_round_trip_every_dtype_and_layout(
    tmp_path: Path, mmap_threshold: int | None
) -> None:
    options = {} if mmap_threshold is None else {"mmap_threshold": mmap_threshold}
    backend = FileBackend(tmp_path / "cache", **options)
    cases = {f"{d}/{lay}": LAYOUTS[lay](sample(d)) for d in DTYPES for lay in LAYOUTS}
    calls: list[str] = []

    @cache(backend=backend, l1=False, serializer="arrays")
    def load(name: str) -> np.ndarray:
        calls.append(name)
        return cases[name]

    for name in cases:
        load(name)
    for name, want in cases.items():
        assert_same_array(load(name), want)
    assert len(calls) == len(cases)
    info = load.cache_info()
    assert (info.misses, info.hits, info.errors) == (len(cases), len(cases), 0)
    stored = backend.get(load.cache_key("float64/F"))
    assert stored is not None and stored.mapped is (mmap_threshold == 64)


def test_containers_of_arrays_round_trip(tmp_path: Path) -> None:
    value = {
        "weights": sample("float32", (5, 4)),
        "F": np.asfortranarray(sample("int16", (3, 7))),
        "view": sample("complex128", (6, 6))[::2, 1::2],
        "layers": [sample("uint8", (2, 2)), (sample("bool", (3,)), 7, "x", None), []],
        "empty": {"nothing": np.zeros((0, 4)), "zero_d": np.array(3.5)},
        "meta": {"n": 3, "big": 2**70, "f": -0.0, "s": "str\u00e9", "b": b"\x00\xff",
                 "flag": True, "none": None, "c": 1 + 2j, "t": (1, "two")},
    }
    got, entry = round_trip(value)
    assert_same_tree(got, value)
    assert len(entry.sections) == 1 + 7

    backend = FileBackend(tmp_path / "cache", mmap_threshold=64)

    @cache(backend=backend, l1=False, serializer="arrays")
    def build() -> dict[str, Any]:
        return value

    build()
    assert_same_tree(build(), value)
    assert build.cache_info().hits == 1


def test_arrays_refuses_what_it_cannot_store_without_pickle() -> None:
    for bad in (np.array([1, "a", None], dtype=object), {"a": np.zeros(3, dtype="i4,f8")},
                [np.zeros(2), threading.Lock()]):
        with pytest.raises(SerializationError):
            ArraySerializer().encode(bad)


_ENDIAN = "?"
DTYPE_STRATEGY = st.one_of(
    hnp.integer_dtypes(endianness=_ENDIAN),
    hnp.unsigned_integer_dtypes(endianness=_ENDIAN),
    hnp.floating_dtypes(endianness=_ENDIAN, sizes=(16, 32, 64)),
    hnp.complex_number_dtypes(endianness=_ENDIAN),
    hnp.boolean_dtypes(),
    hnp.datetime64_dtypes(endianness=_ENDIAN),
    hnp.timedelta64_dtypes(endianness=_ENDIAN),
    hnp.byte_string_dtypes(max_len=6),
    hnp.unicode_string_dtypes(endianness=_ENDIAN, max_len=4),
)


@st.composite
def laid_out_arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays of any plain dtype and shape (0-d and empty included), C, F or a strided view."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    array = draw(hnp.arrays(DTYPE_STRATEGY, shape))
    layout = draw(st.sampled_from(["C", "F", "view"]))
    if layout == "F":
        array = np.asfortranarray(array)
    elif layout == "view" and array.ndim:
        steps = draw(st.lists(st.sampled_from([1, 2, -1, -2]), min_size=array.ndim,
                              max_size=array.ndim))
        array = array[tuple(slice(None, None, s) for s in steps)]
        if draw(st.booleans()):
            array = array.T
    return array


@given(laid_out_arrays())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_direct_round_trip(array: np.ndarray) -> None:
    got, _ = round_trip(array)
    assert_same_array(got, array)


_LEAVES = st.one_of(
    laid_out_arrays(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
    st.binary(max_size=5), st.booleans(), st.none(),
)
TREES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
    ),
    max_leaves=12,
)


@given(TREES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_containers_round_trip(tree: Any) -> None:
    got, _ = round_trip(tree)
    assert_same_tree(got, tree)


@given(laid_out_arrays())
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_property_cached_mapped_round_trip(tmp_path: Path, array: np.ndarray) -> None:
    # One folder for every example; each example has its own key (the array's repr and bytes).
    backend = FileBackend(tmp_path / "prop", mmap_threshold=64)

    @cache(backend=backend, l1=False, serializer="arrays")
    def load(tag: str, raw: bytes) -> np.ndarray:
        return array

    tag = f"{array.dtype.str}{array.shape}{array.strides}"
    load(tag, array.tobytes())
    assert_same_array(load(tag, array.tobytes()), array)
    assert load.cache_info().hits >= 1


# -- 2. what "auto" chooses ---------------------------------------------------------------------


def test_auto_sends_each_kind_of_value_to_its_serializer(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "cache")
    table = pa.table({"x": np.arange(10_000), "s": [str(i) for i in range(10_000)]})
    values: dict[str, Any] = {
        "ndarray": sample("float64", (50, 50)),
        "dict of arrays": {"a": sample("int32"), "b": [sample("U3"), 1.5, "s"], "n": 3},
        "pandas": pd.DataFrame({"a": np.arange(5), "b": list("abcde")}),
        "arrow table": table,
        "plain": {"a": [1, 2.5, "x"], "b": (None, True)},
        "object holding arrays": Holder(w=sample("float64"), labels=["a", "b"]),
        "sklearn-like": Model(alpha=0.1),
        "object array": np.array([1, "a", None, 2.5], dtype=object),
        "dict with object array": {"a": np.array([{"k": 1}], dtype=object)},
        "table in a dict": {"table": table, "n": 1},
        "structured array": np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
    }
    expected = {
        "ndarray": "arrays", "dict of arrays": "arrays", "pandas": "arrow",
        "arrow table": "arrow", "plain": "standard", "object holding arrays": "buffers",
        "sklearn-like": "buffers", "object array": "buffers",
        "dict with object array": "buffers", "table in a dict": "buffers",
        "structured array": "buffers",
    }
    calls: list[str] = []

    @cache(backend=backend, l1=False)
    def compute(name: str) -> Any:
        calls.append(name)
        return values[name]

    results = {}
    for name in values:
        compute(name)
        results[name] = compute(name)  # the hit
        assert serializer_of(backend, compute, name) == expected[name], name
    assert len(calls) == len(values) and compute.cache_info().errors == 0

    assert_same_array(results["ndarray"], values["ndarray"])
    assert_same_tree(results["dict of arrays"], values["dict of arrays"])
    pd.testing.assert_frame_equal(results["pandas"], values["pandas"])
    assert results["plain"] == values["plain"]
    got_model = results["sklearn-like"]
    assert type(got_model) is Model and got_model.params == values["sklearn-like"].params
    np.testing.assert_array_equal(got_model.coef_, values["sklearn-like"].coef_)
    assert got_model.intercept_ == 0.5 and type(got_model.intercept_) is np.float64
    got_obj = results["object array"]
    assert got_obj.dtype == object and list(got_obj) == [1, "a", None, 2.5]
    got_table = results["table in a dict"]
    assert got_table["n"] == 1 and got_table["table"].equals(table)
    np.testing.assert_array_equal(results["object holding arrays"].w, sample("float64"))


# -- 3. loads are writable and independent ------------------------------------------------------


def _array_and_model() -> tuple[np.ndarray, Model]:
    return sample("float64", (300, 40)), Model(coef_size=3000)


@pytest.mark.parametrize("serializer", ["arrays", "buffers"])
@pytest.mark.parametrize("mmap_threshold", [64, 1 << 40], ids=["mapped", "read-in"])
def test_file_hits_are_writable_private_copies(
    tmp_path: Path, mmap_threshold: int, serializer: str
) -> None:
    backend = FileBackend(tmp_path / "cache", mmap_threshold=mmap_threshold)
    original = sample("float64", (300, 40))

    @cache(backend=backend, l1=False, serializer=serializer)
    def weights() -> Any:
        return {"w": original} if serializer == "arrays" else Holder(w=original)

    def w(result: Any) -> np.ndarray:
        return result["w"] if serializer == "arrays" else result.w

    weights()
    path = entry_path(backend, weights)
    stored = backend.get(weights.cache_key())
    assert stored is not None and stored.mapped is (mmap_threshold == 64)
    on_disk = path.read_bytes()

    first, second = w(weights()), w(weights())
    assert first.flags.writeable and second.flags.writeable
    assert not np.shares_memory(first, second)
    first[0, 0] = -1.0
    first[-1, :] = 42.0
    assert second[0, 0] == original[0, 0] and (second[-1] == original[-1]).all()
    assert path.read_bytes() == on_disk  # the write went to private pages or a private copy
    third = w(weights())
    np.testing.assert_array_equal(third, original)
    assert weights.cache_info().hits == 3


@pytest.mark.parametrize("serializer", ["arrays", "buffers"])
def test_l1_hits_are_writable_and_independent(serializer: str, tmp_path: Path) -> None:
    original = sample("int64", (20, 20))
    expected = original.copy()

    for backend in (None, FileBackend(tmp_path / "cache", mmap_threshold=1 << 40)):

        @cache(backend=backend, serializer=serializer)
        def weights() -> Any:
            return {"w": original} if serializer == "arrays" else Holder(w=original)

        def w(result: Any) -> np.ndarray:
            return result["w"] if serializer == "arrays" else result.w

        computed = w(weights())
        first, second = w(weights()), w(weights())
        assert weights.cache_info().l1_hits >= 1
        for hit in (first, second):
            assert hit.flags.writeable
            assert not np.shares_memory(hit, original) and not np.shares_memory(hit, computed)
        first[:] = -7
        computed[0, 0] = 99  # the caller's own result: L1 kept a copy, not this object
        np.testing.assert_array_equal(second, expected)
        np.testing.assert_array_equal(w(weights()), expected)
        original[0, 0] = expected[0, 0]


@pytest.mark.parametrize("serializer", ["arrays", "buffers"])
def test_memory_backend_hits_are_read_only_views(serializer: str) -> None:
    # Documented: a backend that hands back read-only bytes gives read-only arrays.
    backend = MemoryBackend()
    original = sample("float32", (100, 100))

    @cache(backend=backend, l1=False, serializer=serializer)
    def weights() -> Any:
        return {"w": original} if serializer == "arrays" else Holder(w=original)

    weights()
    hit = weights()
    array = hit["w"] if serializer == "arrays" else hit.w
    np.testing.assert_array_equal(array, original)
    assert not array.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        array[0, 0] = 1.0
    writable = np.array(array)  # the documented way to get a writable copy
    writable[0, 0] = 1.0


# -- 4. zero copy and peak memory ---------------------------------------------------------------


def _maps_of(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, perms) of this process's mappings of ``path``."""
    found = []
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == real:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found.append((start, end, fields[1]))
    return found


def test_mapped_hit_views_the_entry_without_copying(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "cache")  # default threshold: 1 MiB and up are mapped
    n = 50 * (1 << 20) // 8
    original = np.linspace(0.0, 1.0, n)

    @cache(backend=backend, l1=False, serializer="auto")
    def big() -> np.ndarray:
        return original

    big()
    path = entry_path(backend, big)
    hit = big()
    assert serializer_of(backend, big) == "arrays"
    assert hit.shape == (n,) and hit[12345] == original[12345]
    begin = address(hit)
    maps = _maps_of(path)
    assert any(start <= begin and begin + hit.nbytes <= end and perms.startswith("rw")
               and perms.endswith("p") for start, end, perms in maps), maps

    # The same, through the pieces: the decoded array lies inside the backend's own mapping.
    stored = backend.get(big.cache_key())
    assert stored is not None and stored.mapped
    base = np.frombuffer(stored.data, np.uint8).ctypes.data
    assert base == pa.py_buffer(stored.data).address
    entry = parse_entry(stored.data, check_sections=False)
    decoded = ArraySerializer().decode(entry.meta, entry.sections)
    assert base < address(decoded) and address(decoded) + decoded.nbytes <= base + len(stored.data)
    assert address(decoded) - base == entry.trailer.sections[1][0]  # the section's own offset
    del hit, decoded, entry, stored


_RSS_CHILD = r"""
import ctypes, gc, json, sys, time
import numpy as np
from arrowstash import FileBackend, cache

mode, kind, directory, nbytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
backend = FileBackend(directory)
computed = []

class Holder:
    def __init__(self, **parts):
        self.__dict__.update(parts)

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return out

@cache(backend=backend, l1=False, serializer="auto" if kind == "arrays" else "buffers")
def result(n):
    computed.append(n)
    if kind == "arrays":
        return ARRAY
    return Holder(coef_=ARRAY, params={"alpha": 0.5, "names": ["a", "b"]})

# Exercise every code path once on a small value, so nothing is imported after the reset.
ARRAY = np.ones(1 << 18)
result(-1)
result(-1)
ARRAY = None
if mode == "store":
    ARRAY = np.full(nbytes // 8, 1.5)  # every page resident before the reset
    ARRAY[-1] = 2.5
computed.clear()
gc.collect()
ctypes.CDLL(None).malloc_trim(0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
reset = status()
started = time.perf_counter()
value = result(nbytes)
seconds = time.perf_counter() - started
peak = status()["VmHWM"]
array = value if kind == "arrays" else value.coef_
print(json.dumps({
    "extra": peak - reset["VmRSS"], "seconds": seconds, "computed": computed,
    "shape": list(array.shape), "last": float(array[-1]), "writeable": array.flags.writeable,
}))
"""


def _rss_child(mode: str, kind: str, directory: Path, nbytes: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "ARROWSTASH_SECRET"}
    done = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, mode, kind, str(directory), str(nbytes)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


GIB = 1 << 30


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["arrays", "buffers"])
def test_storing_and_loading_1gb_adds_under_5_percent_rss(tmp_path: Path, kind: str) -> None:
    directory = tmp_path / "cache"
    try:
        stored = _rss_child("store", kind, directory, GIB)
        assert stored["computed"] == [GIB]
        assert stored["extra"] < 0.05 * GIB, f"store peak extra {stored['extra'] / GIB:.1%}"
        loaded = _rss_child("load", kind, directory, GIB)
        assert loaded["computed"] == []  # a hit, in a fresh process
        assert loaded["shape"] == [GIB // 8] and loaded["last"] == 2.5
        assert loaded["writeable"]
        assert loaded["extra"] < 0.05 * GIB, f"load peak extra {loaded['extra'] / GIB:.1%}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # 1 GiB: do not leave it to pytest


# -- 5. the buffers serializer ------------------------------------------------------------------


def test_large_buffers_travel_out_of_band_small_ones_in_band() -> None:
    big, small = np.arange(10_000, dtype=np.float64), np.arange(10, dtype=np.float64)
    value = Holder(big=big, small=small, f32=np.ones((64, 64), np.float32), s="text")
    got, entry = round_trip(value, BufferSerializer())
    assert len(entry.sections) == 1 + 2  # stream + big + f32; small stays in the stream
    assert bytes(entry.sections[1]) == big.tobytes()
    assert entry.sections[1].nbytes == big.nbytes and entry.sections[2].nbytes == 64 * 64 * 4
    assert len(entry.sections[0]) < 4096  # the stream holds no large buffer
    np.testing.assert_array_equal(got.big, big)
    np.testing.assert_array_equal(got.small, small)
    assert got.s == "text"
    # The loaded large array views its section: no copy.
    view_base = np.frombuffer(entry.sections[1], np.uint8).ctypes.data
    assert address(got.big) == view_base

    _, small_only = round_trip(Holder(a=small, b=b"x" * 100), BufferSerializer())
    assert len(small_only.sections) == 1
    _, lowered = round_trip(Holder(a=small), BufferSerializer(inband_below=16))
    assert len(lowered.sections) == 2


def test_buffers_round_trip_bytes_like_arrow_and_numpy_inside_objects() -> None:
    table = pa.table({"a": np.arange(5000), "b": pa.array([f"s{i}" for i in range(5000)])})
    value = {
        "bytearray": bytearray(b"\x01\x02" * 5000),
        "small bytearray": bytearray(b"ab"),
        "arrow buffer": pa.py_buffer(b"z" * 10_000),
        "table": table,
        "model": Model(alpha=2.0),
        "arrays": [np.asfortranarray(sample("int32", (64, 64))), sample("U3"), sample("M8[ns]")],
        "object array": np.array([{"a": 1}, None], dtype=object),
        "set": {1, 2},
    }
    got, entry = round_trip(value, BufferSerializer())
    assert len(entry.sections) >= 4  # the Arrow columns and the large arrays at least
    assert got["bytearray"] == value["bytearray"] and type(got["bytearray"]) is bytearray
    assert got["small bytearray"] == bytearray(b"ab")
    assert isinstance(got["arrow buffer"], pa.Buffer)
    assert got["arrow buffer"].to_pybytes() == b"z" * 10_000
    assert got["table"].equals(table)
    assert got["model"].params == value["model"].params
    np.testing.assert_array_equal(got["model"].coef_, value["model"].coef_)
    for g, w in zip(got["arrays"], value["arrays"], strict=True):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes()
    assert got["arrays"][0].flags.f_contiguous
    assert list(got["object array"]) == [{"a": 1}, None] and got["set"] == {1, 2}


def test_large_bytearray_travels_in_band_and_round_trips() -> None:
    """Documented: CPython's pickler writes a bytearray in-band itself (BYTEARRAY8) and never
    offers it to buffer_callback; a PickleBuffer-wrapped one travels out-of-band."""
    payload = bytearray(1 << 20)
    got, entry = round_trip({"data": payload}, BufferSerializer())
    assert got["data"] == payload and type(got["data"]) is bytearray
    assert len(entry.sections) == 1
    wrapped, entry = round_trip({"data": pickle.PickleBuffer(payload)}, BufferSerializer())
    assert len(entry.sections) == 2 and bytes(wrapped["data"]) == bytes(payload)


def test_unpicklable_values_raise_and_are_returned_uncached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(SerializationError, match="lock"):
        BufferSerializer().encode({"lock": threading.Lock()})
    with pytest.raises(SerializationError):
        BufferSerializer().encode(lambda: 1)

    backend = FileBackend(tmp_path / "cache")
    lock = threading.Lock()
    calls: list[int] = []

    @cache(backend=backend, serializer="buffers")
    def guarded() -> Any:
        calls.append(1)
        return {"lock": lock, "w": np.zeros(10_000)}

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert guarded()["lock"] is lock
        assert guarded()["lock"] is lock
    assert len(calls) == 2  # never cached
    info = guarded.cache_info()
    assert info.errors == 2 and info.hits == 0
    assert list(backend.entries()) == []
    assert _warnings(caplog, "result not cached")


class _Node:
    def __init__(self, nxt: Any) -> None:
        self.nxt = nxt


def test_too_deep_to_pickle_is_returned_uncached(tmp_path: Path) -> None:
    """pickle raises RecursionError on a deep object graph: the value is returned uncached (and
    logged), the call does not fail after the function has computed its result."""
    calls: list[int] = []

    @cache(backend=FileBackend(tmp_path / "cache"), serializer="auto")
    def chain(n: int) -> Any:
        calls.append(n)
        node = None
        for _ in range(n):
            node = _Node(node)
        return node

    result = chain(100_000)
    assert isinstance(result, _Node) and calls == [100_000]
    assert chain.cache_info().errors == 1


_EVOLVING = """
from typing import NamedTuple

class Result(NamedTuple):
    a: int
    b: int{extra}
"""


def test_entry_of_a_changed_class_is_a_logged_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unpickling an object whose class changed raises TypeError (here a NamedTuple gained a
    field): a logged miss that recomputes, not a call that fails until the cache is cleared."""
    (tmp_path / "evolving_result.py").write_text(_EVOLVING.format(extra=""))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("evolving_result")
    calls: list[int] = []

    @cache(backend=FileBackend(tmp_path / "cache"), l1=False, serializer="buffers")
    def compute(x: int) -> Any:
        calls.append(x)
        return module.Result(*range(len(module.Result._fields)))

    try:
        assert compute(1) == (0, 1)
        assert compute(1) == (0, 1) and calls == [1]
        # The code changes: the class gains a field (as between two runs of a program).
        (tmp_path / "evolving_result.py").write_text(_EVOLVING.format(extra="\n    c: int"))
        importlib.invalidate_caches()
        module = importlib.reload(module)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert compute(1) == (0, 1, 2)
        assert calls == [1, 1]
        assert compute.cache_info().errors == 1
    finally:
        sys.modules.pop("evolving_result", None)


# -- 6. signing -------------------------------------------------------------------------------


def _tracked_factory(backend: FileBackend, calls: list[int], **options: Any) -> CachedFunction:
    """A cached function of a fixed qualified name: instances made with different secrets read
    and write the same entries."""

    @cache(backend=backend, l1=False, serializer="buffers", **options)
    def tracked(n: int) -> Tracked:
        calls.append(n)
        return Tracked(n)

    return tracked  # type: ignore[return-value]


def _signed(path: Path) -> bool:
    return bool(read_header(path.read_bytes()).flags & FLAG_SIGNED)


def _flip(path: Path, section: int) -> None:
    """Flip one byte in the middle of a section of the stored file, in place (no checksum or
    tag recomputed)."""
    entry = parse_entry(path.read_bytes(), check_sections=False)
    offset, length, _ = entry.trailer.sections[section]
    at = offset + length // 2
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def no_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROWSTASH_SECRET", raising=False)
    UNPICKLED.clear()


@pytest.mark.usefixtures("no_env_secret")
@pytest.mark.parametrize("section", [1, 0], ids=["data-section", "pickle-stream"])
@pytest.mark.parametrize("mmap_threshold", [64, 1 << 40], ids=["mapped", "read-in"])
def test_signed_entries_and_tampering(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mmap_threshold: int, section: int
) -> None:
    backend = FileBackend(tmp_path / "cache", mmap_threshold=mmap_threshold)
    calls: list[int] = []
    tracked = _tracked_factory(backend, calls, secret="s3cret")
    tracked(3)
    path = entry_path(backend, tracked, 3)
    assert _signed(path)
    hit = tracked(3)
    assert calls == [3] and hit.n == 3 and UNPICKLED == [3]
    np.testing.assert_array_equal(hit.payload, np.arange(3000, dtype=np.float64))

    _flip(path, section)
    if section == 1:
        # The tampered entry would unpickle fine (and run __setstate__) if it were let through:
        entry = parse_entry(path.read_bytes(), check_sections=False)
        BufferSerializer().decode(entry.meta, entry.sections)
        assert UNPICKLED == [3, 3]
        UNPICKLED.clear()
    else:
        UNPICKLED.clear()
    errors = tracked.cache_info().errors
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        again = tracked(3)
    assert UNPICKLED == []  # never unpickled
    assert calls == [3, 3] and again.n == 3  # a miss: the function ran again
    assert tracked.cache_info().errors == errors + 1
    assert _warnings(caplog, "unreadable cache entry")
    assert _signed(path)  # and the recomputed entry is signed again
    assert tracked(3).n == 3 and calls == [3, 3]


@pytest.mark.usefixtures("no_env_secret")
def test_secret_from_the_environment_signs_and_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FileBackend(tmp_path / "cache", mmap_threshold=64)
    calls: list[int] = []
    monkeypatch.setenv("ARROWSTASH_SECRET", "s3cret")
    from_env = _tracked_factory(backend, calls)
    from_env(1)
    assert _signed(entry_path(backend, from_env, 1))
    assert from_env(1).n == 1 and calls == [1]
    # The same secret given explicitly reads it; another secret refuses it.
    assert _tracked_factory(backend, calls, secret="s3cret")(1).n == 1 and calls == [1]
    monkeypatch.delenv("ARROWSTASH_SECRET")
    UNPICKLED.clear()
    assert _tracked_factory(backend, calls, secret="other")(1).n == 1
    assert calls == [1, 1] and UNPICKLED == []


@pytest.mark.usefixtures("no_env_secret")
@pytest.mark.parametrize("writer_secret", [None, "other"], ids=["unsigned", "other-secret"])
def test_reader_with_a_secret_refuses_unsigned_or_foreign_entries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, writer_secret: str | None
) -> None:
    backend = FileBackend(tmp_path / "cache", mmap_threshold=64)
    calls: list[int] = []
    writer = _tracked_factory(backend, calls, secret=writer_secret)
    writer(5)
    path = entry_path(backend, writer, 5)
    assert _signed(path) is (writer_secret is not None)
    assert writer(5).n == 5 and calls == [5]  # the writer reads its own entry back
    UNPICKLED.clear()

    reader = _tracked_factory(backend, calls, secret="s3cret")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert reader(5).n == 5
    assert calls == [5, 5] and UNPICKLED == []
    assert reader.cache_info().errors == 1
    assert _warnings(caplog, "signature")
    assert _signed(path)  # the reader replaced it with its own signed entry
    assert reader(5).n == 5 and calls == [5, 5] and UNPICKLED == [5]


@pytest.mark.usefixtures("no_env_secret")
@pytest.mark.parametrize("mmap_threshold", [64, 1 << 40], ids=["mapped", "read-in"])
def test_forged_trailer_with_a_valid_checksum_is_refused(
    tmp_path: Path, mmap_threshold: int
) -> None:
    backend = FileBackend(tmp_path / "cache", mmap_threshold=mmap_threshold)
    calls: list[int] = []
    reader = _tracked_factory(backend, calls, secret="s3cret")
    key = reader.cache_key(7)

    def plant(secret: bytes) -> None:
        encoded = BufferSerializer().encode(Tracked(7))
        encoded.sign_with = secret
        raw = entry_bytes(key, encoded, created=time.time(), expires=None)
        entry = parse_entry(raw)  # a well-formed entry: header checksum and sections check out
        assert entry.header.flags & FLAG_SIGNED and entry.trailer.tag is not None
        target = Path(backend.path(key))
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_suffix(".planting")
        temp.write_bytes(raw)
        os.replace(temp, target)  # a new file, as any writer would make it

    plant(b"other")
    UNPICKLED.clear()
    assert reader(7).n == 7
    assert calls == [7] and UNPICKLED == [] and reader.cache_info().errors == 1
    # Control: the same procedure with the right secret is accepted (no call, one unpickle).
    plant(b"s3cret")
    UNPICKLED.clear()
    assert reader(7).n == 7
    assert calls == [7] and UNPICKLED == [7] and reader.cache_info().errors == 1


@pytest.mark.usefixtures("no_env_secret")
def test_arrays_entries_need_no_secret_and_a_secret_signs_them(tmp_path: Path) -> None:
    """Arrays entries need no secret; but a reader with a secret accepts only entries signed
    with it (issue 20, item 3: a secret authenticates every entry, not only pickled ones)."""
    backend = FileBackend(tmp_path / "cache", mmap_threshold=64)
    calls: list[int] = []

    def make(secret: str | None) -> CachedFunction:
        @cache(backend=backend, l1=False, secret=secret)  # "auto": arrays go to "arrays"
        def weights(n: int) -> dict[str, Any]:
            calls.append(n)
            return {"w": np.full((n, n), float(n)), "n": n}

        return weights  # type: ignore[return-value]

    unsigned_writer = make(None)
    unsigned_writer(4)
    assert serializer_of(backend, unsigned_writer, 4) == "arrays"
    assert not _signed(entry_path(backend, unsigned_writer, 4))
    signed_reader = make("s3cret")
    assert signed_reader(4)["w"][3, 3] == 4.0
    assert calls == [4, 4] and signed_reader.cache_info().errors == 1  # unsigned: a miss
    assert _signed(entry_path(backend, signed_reader, 4))  # and stored again, signed
    assert signed_reader(4)["n"] == 4 and calls == [4, 4]
    assert make(None)(4)["n"] == 4 and calls == [4, 4]  # no secret: signed entries still read
    assert make("other")(4)["n"] == 4 and calls == [4, 4, 4]  # another secret: a miss


# -- 7. shared backends -------------------------------------------------------------------------


class SharedMemoryBackend(MemoryBackend):
    """A real in-process backend that only *declares* it is shared (writable by others), which
    is what the decorator's pickle rules look at."""

    capabilities = dataclasses.replace(MemoryBackend.capabilities, shared=True)


@pytest.mark.usefixtures("no_env_secret")
def test_shared_backend_refuses_buffers_without_a_secret() -> None:
    shared = SharedMemoryBackend()
    with pytest.raises(ValueError, match="secret"):

        @cache(backend=shared, serializer="buffers")
        def unsafe() -> Any:
            return Model()

    with pytest.raises(ValueError, match="secret"):
        cache(backend=shared, serializer=BufferSerializer())(lambda: None)


@pytest.mark.usefixtures("no_env_secret")
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_shared_backend_with_a_secret_caches_pickled_values(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    shared = SharedMemoryBackend()
    options: dict[str, Any] = {}
    if how == "argument":
        options["secret"] = "s3cret"
    else:
        monkeypatch.setenv("ARROWSTASH_SECRET", "s3cret")
    calls: list[int] = []

    @cache(backend=shared, serializer="buffers", l1=False, **options)
    def model(alpha: float) -> Model:
        calls.append(1)
        return Model(alpha=alpha)

    model(0.5)
    got = model(0.5)
    assert calls == [1] and got.params["alpha"] == 0.5
    np.testing.assert_array_equal(got.coef_, Model().coef_)
    (info,) = shared.entries()
    assert info.serializer == "buffers"


@pytest.mark.usefixtures("no_env_secret")
def test_shared_backend_auto_without_a_secret_caches_only_what_needs_no_pickle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shared = SharedMemoryBackend()
    values: dict[str, Any] = {
        "model": Model(), "array": sample("float64"), "arrays": {"a": sample("int8"), "n": 1},
        "plain": {"x": [1, 2, "three"]},
    }
    calls: list[str] = []

    @cache(backend=shared, l1=False)
    def compute(name: str) -> Any:
        calls.append(name)
        return values[name]

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for name in values:
            compute(name)
            compute(name)
    assert calls == ["model", "model", "array", "arrays", "plain"]
    assert compute.cache_info().errors == 2
    assert _warnings(caplog, "secret")
    assert {serializer_of(shared, compute, n) for n in ("array", "arrays")} == {"arrays"}
    assert serializer_of(shared, compute, "plain") == "standard"
    assert not any(e.key == compute.cache_key("model").hex for e in shared.entries())
    assert_same_array(compute("array"), values["array"])
