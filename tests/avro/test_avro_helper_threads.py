"""Where the native codecs' kept helper threads start.

After the process slept (a consumer between polls), the scheduler woke a helper on its caller's
own core and the two shared it for the whole call: two threads were slower than one. Each
extension counts the helper jobs that began on their caller's core (``same_core()``); a woken
helper is steered off that core, so the count must not move."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest

from arrowstash import config
from arrowstash.avro import decode, encode, parse_schema
from arrowstash.avro import encoder as encoder_module
from arrowstash.avro import writer_decoder as codec

pytestmark = pytest.mark.skipif(
    codec._cdecode is None or encoder_module._cencode is None
    or config.usable_cpus() < 2,
    reason="needs the native codecs and two cores",
)

SCHEMA = parse_schema({"type": "record", "name": "R", "fields": [
    {"name": "s", "type": "string"}, {"name": "n", "type": "long"}]})
ROWS = 100_000  # 3 MB of messages: two threads' worth for the decoder (1 MB each) and the encoder


@pytest.fixture(scope="module")
def batch() -> pa.RecordBatch:
    schema = pa.schema([pa.field("s", pa.string(), nullable=False),
                        pa.field("n", pa.int64(), nullable=False)])
    return pa.record_batch([pa.array([f"a longer name, number {i}" for i in range(ROWS)]),
                            pa.array(range(ROWS), pa.int64())], schema=schema)


def test_a_helper_woken_after_a_pause_starts_off_its_callers_core(batch: pa.RecordBatch) -> None:
    messages = encode(batch, SCHEMA, threads=1).to_pylist()
    decoded = decode(messages, SCHEMA, threads=2)  # the helpers exist from here on
    assert decoded.equals(batch)
    encode(batch, SCHEMA, threads=2)
    dec, enc = codec._cdecode.same_core(), encoder_module._cencode.same_core()
    for _ in range(8):
        time.sleep(0.02)  # long enough for the other core to go idle
        assert decode(messages, SCHEMA, threads=2).equals(batch)
        time.sleep(0.02)
        encode(batch, SCHEMA, threads=2)
    assert (codec._cdecode.same_core() - dec, encoder_module._cencode.same_core() - enc) == (0, 0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU masks here")
def test_a_caller_held_to_one_core_still_gets_its_threads_result(batch: pa.RecordBatch) -> None:
    """No other core to steer a helper to: it is woken as it was, and the batch is the same."""
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    try:
        messages = encode(batch, SCHEMA, threads=2).to_pylist()
        for _ in range(3):
            time.sleep(0.02)
            assert decode(messages, SCHEMA, threads=2).equals(batch)
    finally:
        os.sched_setaffinity(0, mask)
