"""Entries written by the first release (tests/fixtures/entries-v1, made by
tests/fixtures/make_entries_v1.py with that release) still load, through the same path a hit
takes: the pipeline parses, checks and decodes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from arrowstash import MemoryBackend, cache
from arrowstash.backends.base import Stored
from arrowstash.caching.pipeline import MISSING
from arrowstash.entry import Key

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
from make_entries_v1 import HERE, KEY, SECRET, expected_values

MANIFEST = json.loads((HERE / "manifest.json").read_text())
SIGNED = ("buffers", "encrypted")  # signed (or authenticated by encryption) when written


def _same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for name in want:
            _same(got[name], want[name])
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, pd.DataFrame):
        pd.testing.assert_frame_equal(got, want)
    elif isinstance(want, pa.Table):
        table = got if isinstance(got, pa.Table) else pa.Table.from_pandas(got,
                                                                           preserve_index=False)
        assert table.cast(want.schema).equals(want)  # Avro strings come back large
    else:
        assert got == want and type(got) is type(want)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_first_release_entry_loads(name: str) -> None:
    value = expected_values()[name][1]
    meta = MANIFEST[name]
    # first-release signatures (pickled entries) still verify; other unsigned entries load
    # where no secret is set (under one they are a miss: see the next test)
    fn: Any = cache(backend=MemoryBackend(), serializer="auto",
                    secret=SECRET if name in SIGNED else None, encrypt=name == "encrypted",
                    encryption_key=KEY if name == "encrypted" else None)(lambda: None)
    key = Key(meta["namespace"], meta["function"], bytes.fromhex(meta["digest"]))
    data = memoryview(bytearray((HERE / f"{name}.ast").read_bytes()))
    got, expires = fn._core.load_entry(key, Stored(data), True)
    assert got is not MISSING, f"{name}: the first release's entry no longer loads"
    assert expires == 0.0
    assert fn.cache_info().errors == 0
    _same(got, value)


@pytest.mark.parametrize("name", sorted(set(MANIFEST) - set(SIGNED)))
def test_an_unsigned_old_entry_is_a_logged_miss_under_a_secret(name: str) -> None:
    """A secret means every entry must carry a tag made with it: the first release signed only
    pickled entries, so its other entries are recomputed (once) where a secret is set."""
    meta = MANIFEST[name]
    fn: Any = cache(backend=MemoryBackend(), secret=SECRET)(lambda: None)
    key = Key(meta["namespace"], meta["function"], bytes.fromhex(meta["digest"]))
    data = memoryview(bytearray((HERE / f"{name}.ast").read_bytes()))
    got, _ = fn._core.load_entry(key, Stored(data), True)
    assert got is MISSING
    assert fn.cache_info().errors == 1


def test_a_flipped_byte_in_an_old_entry_is_a_miss() -> None:
    fn: Any = cache(backend=MemoryBackend())(lambda: None)
    meta = MANIFEST["standard"]
    key = Key(meta["namespace"], meta["function"], bytes.fromhex(meta["digest"]))
    data = bytearray((HERE / "standard.ast").read_bytes())
    data[100] ^= 0x40
    got, _ = fn._core.load_entry(key, Stored(memoryview(data)), True)
    assert got is MISSING
    assert fn.cache_info().errors == 1
