"""A compressed Arrow section is refused before it is decompressed when its buffers declare more
than ARROWSTASH_MAX_VALUE_BYTES (default: 1024 times the stored size, at least 1 GiB): a forged
entry of a few kilobytes cannot make a load allocate gigabytes (issue 20, items 3 and 11)."""

from __future__ import annotations

import resource
import struct
import time
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from arrowstash import MemoryBackend, cache
from arrowstash.backends.base import Stored
from arrowstash.caching.pipeline import MISSING
from arrowstash.entry import Key
from arrowstash.entry.format import entry_bytes, materialize
from arrowstash.errors import CorruptEntryError
from arrowstash.serializers._arrow.limits import _U32, _Table, check_expansion
from arrowstash.serializers.arrow import ArrowSerializer

SERIALIZER = ArrowSerializer(compression="zstd")


def _zeros(rows: int) -> Any:
    return materialize(SERIALIZER.encode(pd.DataFrame({"a": np.zeros(rows, dtype=np.int64)})))


def _inflate(section: bytes, declared: int) -> bytearray:
    """``section`` with the declared uncompressed length of every compressed buffer of its
    first record batch set to ``declared``: what a forger writes."""
    out = bytearray(section)
    position = 0
    while True:
        length = struct.unpack_from("<i", out, position + 4)[0]
        data = bytes(out[position + 8 : position + 8 + length])
        root = _Table(data, _U32.unpack_from(data, 0)[0])
        body_at, body_length = position + 8 + length, root.scalar(3, struct.Struct("<q"))
        if root.scalar(1, struct.Struct("<B")) == 3:
            start, count = root.table(2).structs(2, 16)  # type: ignore[union-attr]
            for i in range(count):
                offset, size = struct.unpack_from("<qq", data, start + 16 * i)
                if size >= 8:
                    struct.pack_into("<q", out, body_at + offset, declared)
            return out
        position = body_at + body_length


def test_an_honest_stream_passes_and_a_forged_length_is_refused_at_once() -> None:
    encoded = _zeros(1000)
    (section,) = encoded.sections
    check_expansion(memoryview(section), 1 << 30)
    forged = _inflate(bytes(section), 1 << 40)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    with pytest.raises(CorruptEntryError, match="ARROWSTASH_MAX_VALUE_BYTES"):
        SERIALIZER.decode(encoded.meta, [memoryview(forged)])
    assert time.perf_counter() - started < 0.05
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 << 10  # KiB: 64 MiB
    with pytest.raises(CorruptEntryError, match="declares -5 bytes"):
        check_expansion(memoryview(_inflate(bytes(section), -5)), 1 << 30)


@pytest.mark.parametrize("cut", [3, 9, 100, 300])
def test_damaged_framing_is_a_corrupt_entry(cut: int) -> None:
    (section,) = _zeros(1000).sections
    damaged = bytearray(bytes(section)[:cut]) + bytes(range(256))
    with pytest.raises(CorruptEntryError):
        check_expansion(memoryview(damaged), 1 << 30)


def test_the_limit_is_configurable_and_a_refusal_is_a_logged_miss(
        monkeypatch: pytest.MonkeyPatch) -> None:
    encoded = _zeros(1 << 20)  # 8 MiB of zeros: a few hundred bytes compressed
    key = Key("limits", "tests.zeros", b"\x03" * 16)
    data = bytes(entry_bytes(key, encoded, created=time.time(), expires=None))
    fn: Any = cache(backend=MemoryBackend(), serializer=SERIALIZER)(lambda: None)
    monkeypatch.setenv("ARROWSTASH_MAX_VALUE_BYTES", str(1 << 20))
    value, _ = fn._core.load_entry(key, Stored(memoryview(data)), True)
    assert value is MISSING and fn.cache_info().errors == 1
    monkeypatch.setenv("ARROWSTASH_MAX_VALUE_BYTES", str(16 << 20))
    value, _ = fn._core.load_entry(key, Stored(memoryview(data)), True)
    assert isinstance(value, pd.DataFrame) and len(value) == 1 << 20
    monkeypatch.delenv("ARROWSTASH_MAX_VALUE_BYTES")
    value, _ = fn._core.load_entry(key, Stored(memoryview(data)), True)
    assert len(value) == 1 << 20  # the default: at least 1 GiB


def test_a_billion_nulls_in_a_small_uncompressed_stream_are_refused() -> None:
    """No buffers, so nothing to decompress; converting them would still allocate 8 GB."""
    serializer = ArrowSerializer(compression=None)
    encoded = materialize(serializer.encode(pa.table({"n": pa.nulls(1000)})))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([("n", pa.null())])) as writer:
        writer.write_batch(pa.record_batch([pa.nulls(10**9)], names=["n"]))
    forged = sink.getvalue().to_pybytes()
    assert len(forged) < 1000
    check_expansion(memoryview(bytes(encoded.sections[-1])), 1 << 20)
    with pytest.raises(CorruptEntryError, match="ARROWSTASH_MAX_VALUE_BYTES"):
        serializer.decode(encoded.meta, [memoryview(forged)])
