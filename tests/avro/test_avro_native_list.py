"""The native decoder's list input: each message is read in place and held by a reference of
the decoder's own while the GIL is released, so a list that Python code changes during the call
(here the block counts' ``__getitem__``, which runs under the GIL between messages) neither frees
a message being read nor makes the decoder read past the list."""

from __future__ import annotations

from typing import Any

import pytest

from arrowstash.avro import decode, decode_plan, parse_schema
from arrowstash.avro import writer_decoder as decoder_module
from arrowstash.avro.decoder import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the native decoder is not built")

SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}


def _call(messages: list[Any], counts: Any) -> Any:
    plan = decoder_module._compiled(parse_schema(SCHEMA))
    return decoder_module._cdecode.decode_list(plan.native, messages, counts, 1, True, False, 0)


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

    status, columns, _ = _call(messages, Counts(messages, 1, replace))
    assert status == 0
    batch = decode([_message("x" * 40 + "0"), messages[1], messages[2], _message("new")], SCHEMA)
    plan = decoder_module._compiled(parse_schema(SCHEMA))
    assert decode_plan.assemble(plan, columns).to_pylist() == batch.to_pylist()


def test_list_and_tuple_and_other_sequences_decode_alike() -> None:
    messages = [_message(t) for t in ("a", "é", "")]
    expected = [{"s": "a"}, {"s": "é"}, {"s": ""}]
    assert decode(messages, SCHEMA).to_pylist() == expected
    assert decode(tuple(messages), SCHEMA).to_pylist() == expected
    assert decode(iter(messages), SCHEMA).to_pylist() == expected
    assert decode([bytearray(m) for m in messages], SCHEMA).to_pylist() == expected
