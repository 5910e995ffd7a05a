"""The native decoder's list input. A list of bytes is read in place with the GIL kept, so no
other thread can change it during a decode; anything else (blocks with counts, items that are not
bytes, errors) goes the general way, where each message is held by a reference of the decoder's
own while the GIL is released, so a list that Python code changes during the call (here the block
counts' ``__getitem__``, which runs under the GIL between messages) neither frees a message being
read nor makes the decoder read past the list."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from arrowstash import AvroDecodeError
from arrowstash.avro import decode, parse_schema
from arrowstash.avro import writer_decoder as decoder_module
from arrowstash.avro.decoder import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the native decoder is not built")

SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}


def _call(messages: list[Any], counts: Any) -> Any:
    plan = decoder_module._native_plan(parse_schema(SCHEMA))
    return decoder_module._cdecode.decode_list(plan, messages, counts, 1, True, False, 0)


def _message(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw) << 1]) + raw


class Counts:
    """One datum per message; at message ``at``, ``change(messages)`` runs first."""

    def __init__(self, messages: list[Any], at: int, change: Any) -> None:
        self.messages, self.at, self.change = messages, at, change

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i: int) -> int:
        if i == self.at:
            self.change(self.messages)
        return 1


def test_a_list_emptied_during_the_call_is_an_error_not_a_read_past_it() -> None:
    messages = [_message(f"m{i}") for i in range(5)]
    with pytest.raises(RuntimeError, match="the list of messages changed during decode"):
        _call(messages, Counts(messages, 2, list.clear))


def test_a_message_replaced_after_it_was_taken_is_still_read() -> None:
    """Message 0, taken before the list changes, has no other reference left: the decoder's
    own keeps it alive. Later messages are read as the list holds them when reached."""
    messages = [_message("x" * 40 + str(i)) for i in range(4)]

    def replace(ms: list[Any]) -> None:
        ms[0] = _message("other")
        ms[3] = _message("new")

    status, exported, _ = _call(messages, Counts(messages, 1, replace))
    assert status == 0
    batch = decode([_message("x" * 40 + "0"), messages[1], messages[2], _message("new")], SCHEMA)
    plan = decoder_module._compiled(parse_schema(SCHEMA))
    assert decoder_module._imported(plan, exported).to_pylist() == batch.to_pylist()


def test_list_and_tuple_and_other_sequences_decode_alike() -> None:
    messages = [_message(t) for t in ("a", "é", "")]
    expected = [{"s": "a"}, {"s": "é"}, {"s": ""}]
    assert decode(messages, SCHEMA).to_pylist() == expected
    assert decode(tuple(messages), SCHEMA).to_pylist() == expected
    assert decode(iter(messages), SCHEMA).to_pylist() == expected
    assert decode([bytearray(m) for m in messages], SCHEMA).to_pylist() == expected


def _strings(n: int) -> list[bytes]:
    return [_message(f"message {i} " + "é" * (i % 5)) for i in range(n)]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_late_item_that_is_not_bytes_decodes_the_list_the_general_way(threads: int) -> None:
    """The in-place path stops at the first item that is not bytes; the general path then
    decodes everything, bytearray and memoryview included."""
    messages: list[Any] = _strings(120_000)
    expected = [{"s": f"message {i} " + "é" * (i % 5)} for i in range(120_000)]
    messages[-1] = bytearray(messages[-1])
    messages[60_000] = memoryview(messages[60_000])
    assert decode(messages, SCHEMA, threads=threads).to_pylist() == expected


@pytest.mark.parametrize("threads", [1, 2])
def test_errors_found_in_place_are_reported_as_the_general_path_reports_them(
        threads: int) -> None:
    messages: list[Any] = _strings(120_000)
    messages[90_000] = b"\x04\xff\xfe"  # invalid UTF-8
    with pytest.raises(AvroDecodeError, match="message 90000"):
        decode(messages, SCHEMA, threads=threads)
    messages[90_000] = None
    with pytest.raises(AvroDecodeError, match="message 90000"):
        decode(messages, SCHEMA, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_another_thread_changing_the_list_never_changes_a_result(threads: int) -> None:
    """The list is read with the GIL kept: a thread that clears, appends to and replaces items
    of the list runs before or after a decode, never during one, so each result is the list's
    content at the call (or a clear error if the list is empty by then)."""
    originals = _strings(150_000)  # over 2 MiB: two threads when asked
    messages: list[Any] = list(originals)
    stop = threading.Event()

    def mutate() -> None:
        while not stop.is_set():
            messages.clear()
            messages.extend(originals)
            messages[5] = _message("replaced")
            messages.append(_message("appended"))

    mutator = threading.Thread(target=mutate)
    mutator.start()
    try:
        for _ in range(30):
            rows = decode(messages, SCHEMA, threads=threads).column(0).to_pylist()
            if rows:  # possibly caught right after clear()
                n = len(rows)
                assert rows[n - 1] in ("appended", f"message {n - 1} " + "é" * ((n - 1) % 5))
                assert rows[5] in ("replaced", "message 5 ")
                assert rows[6:n - 1] == [f"message {i} " + "é" * (i % 5) for i in range(6, n - 1)]
    finally:
        stop.set()
        mutator.join()
