"""Wire headers (Confluent, Apicurio, single-object): added and stripped for whole columns,
checked against hand-built bytes, and refused with the message's index when missing or wrong."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from arrowstash import AvroDecodeError
from arrowstash.avro.framing import FRAMINGS, add_header, ids_of, strip_header

PAYLOADS = [b"\x02\x06abc", b"", b"\x00" * 40, bytes(range(256))]


def _by_hand(kind: str, payload: bytes, ident: int) -> bytes:
    if kind == "confluent":
        return b"\x00" + struct.pack(">i", ident) + payload
    if kind == "apicurio":
        return b"\x00" + struct.pack(">q", ident) + payload
    return b"\xc3\x01" + struct.pack("<Q", ident) + payload


@pytest.mark.parametrize(("kind", "ident"),
                         [("confluent", 7), ("confluent", -1), ("apicurio", 2**40 + 3),
                          ("single-object", 0xC15D213AA4D7A795)])
def test_headers_are_the_documented_bytes(kind: str, ident: int) -> None:
    framed = add_header(PAYLOADS, kind, ident)
    assert framed.to_pylist() == [_by_hand(kind, p, ident) for p in PAYLOADS]
    unframed = strip_header(framed, kind)
    assert unframed.payloads.to_pylist() == PAYLOADS
    assert unframed.ids.to_pylist() == [ident] * len(PAYLOADS)
    assert unframed.ids.type == FRAMINGS[kind].arrow_type


@given(st.lists(st.tuples(st.binary(max_size=30), st.integers(-(2**31), 2**31 - 1)),
                max_size=40),
       st.integers(0, 3), st.booleans())
def test_round_trip_of_any_payloads_and_ids(
    items: list[tuple[bytes, int]], start: int, large: bool
) -> None:
    payloads = [p for p, _ in items]
    ids = [i for _, i in items]
    framed = add_header(pa.array(payloads, pa.large_binary() if large else pa.binary()),
                        "confluent", ids)
    assert framed.to_pylist() == [_by_hand("confluent", p, i) for p, i in items]
    # A slice (offset into the buffers) strips the same way as a fresh array.
    view = framed.slice(min(start, len(framed)))
    unframed = strip_header(view, "confluent")
    assert unframed.payloads.to_pylist() == payloads[min(start, len(items)):]
    assert unframed.ids.to_pylist() == ids[min(start, len(items)):]
    assert ids_of(view, "confluent").to_pylist() == ids[min(start, len(items)):]


def test_inputs_lists_arrays_and_buffer_with_offsets() -> None:
    framed = add_header(PAYLOADS, "confluent", 3)
    data = b"".join(framed.to_pylist())
    offsets = np.cumsum([0] + [len(m) for m in framed.to_pylist()])
    for messages in (framed.to_pylist(), framed, pa.chunked_array([framed]), (data, offsets)):
        assert strip_header(messages, "confluent").payloads.to_pylist() == PAYLOADS


def test_stripping_checks_the_magic_byte_and_names_the_message() -> None:
    framed = add_header(PAYLOADS, "confluent", 1).to_pylist()
    framed[2] = b"\x01" + framed[2][1:]
    with pytest.raises(AvroDecodeError, match=r"message 2 at byte 0: expected the confluent "
                                              r"header starting 00, found 01"):
        strip_header(framed, "confluent")


def test_unframed_messages_are_refused_not_decoded_as_garbage() -> None:
    with pytest.raises(AvroDecodeError, match=r"message 1: 3 bytes, shorter than the 5-byte"):
        strip_header([b"\x00\x00\x00\x00\x01", b"abc"], "confluent")
    with pytest.raises(AvroDecodeError, match="message 0 at byte 0: expected the single-object"):
        strip_header([b"\x00" * 12], "single-object")


def test_expected_ids_reject_others() -> None:
    framed = add_header(PAYLOADS, "confluent", [5, 5, 6, 5])
    assert strip_header(framed, "confluent", expect=[5, 6]).ids.to_pylist() == [5, 5, 6, 5]
    with pytest.raises(AvroDecodeError, match="message 2: schema id 6 is not the expected 5"):
        strip_header(framed, "confluent", expect=5)


def test_null_messages_are_errors() -> None:
    with pytest.raises(AvroDecodeError, match="message 1 is null"):
        strip_header(pa.array([b"\x00\x00\x00\x00\x01", None]), "confluent")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown framing 'kafka'"):
        add_header(PAYLOADS, "kafka", 1)
    with pytest.raises(ValueError, match="4 payloads but 2 ids"):
        add_header(PAYLOADS, "confluent", [1, 2])
    with pytest.raises(ValueError, match="must fit int32"):
        add_header(PAYLOADS, "confluent", 2**31)
    with pytest.raises(TypeError, match="not one bytes-like object"):
        strip_header(b"\x00\x00\x00\x00\x01", "confluent")
