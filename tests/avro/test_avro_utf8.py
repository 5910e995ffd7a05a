"""UTF-8 validation of decoded strings, held to Python's own decoder as the oracle: every invalid
sequence at every position of a string longer than two vector blocks, overlongs, surrogates,
values past U+10FFFF, sequences cut at a string's end or split between two strings, the edges
of each sequence length, and strings whose lengths sit at the vector width's boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _avro_strategies import zigzag
from arrowstash import AvroDecodeError
from arrowstash.avro import decode

ONE = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
LIST = {"type": "record", "name": "R", "fields": [
    {"name": "s", "type": {"type": "array", "items": "string"}}]}
TWO = {"type": "record", "name": "R", "fields": [
    {"name": "a", "type": "string"}, {"name": "b", "type": "string"}]}

INVALID = [
    b"\x80", b"\xbf",                                   # a continuation byte with no lead
    b"\xc0\x80", b"\xc1\xbf",                           # overlong 2-byte forms
    b"\xe0\x80\x80", b"\xe0\x9f\xbf",                   # overlong 3-byte forms
    b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf",           # overlong 4-byte forms
    b"\xed\xa0\x80", b"\xed\xbf\xbf",                   # UTF-16 surrogates
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf7\xbf\xbf\xbf",  # past U+10FFFF
    b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff",          # bytes that never occur
    b"\xc2", b"\xe2\x82", b"\xf0\x9f\x98",              # sequences cut short
    b"\xc2\xc2\x80", b"\xe2\x28\xa1", b"\xf0\x9f\x28\x80",  # a lead followed by a non-continuation
    b"\x80\x80\x80\x80",                                # continuations in a row
]
# the first and last code point of each sequence length, and around the surrogates
EDGES = ["\x00", "\x7f", "\x80", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uffff",
         "\U00010000", "\U0010ffff"]



def string(raw: bytes) -> bytes:
    return zigzag(len(raw)) + raw


def valid(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check(messages: list[bytes], schema: dict, strings: list[list[bytes]]) -> None:
    """Decoding ``messages`` either returns ``strings`` decoded, or (the first message with an
    invalid string being ``bad``) fails naming message ``bad``: never anything else."""
    bad = next((i for i, row in enumerate(strings) if not all(map(valid, row))), None)
    for threads in (1, 2):
        if bad is None:
            got = decode(messages, schema, threads=threads).to_pylist()
            names = [f["name"] for f in schema["fields"]]
            assert got == [dict(zip(names, (s.decode() for s in row), strict=True))
                           for row in strings]
        else:
            with pytest.raises(AvroDecodeError, match=rf"^message {bad} .*invalid UTF-8"):
                decode(messages, schema, threads=threads)


BASE = ("ascii then é, € and 😀 mixed; Дмитрий, 山田, الحسن, and more ASCII to pass two "
        "32-byte blocks").encode()


@pytest.mark.parametrize("seq", INVALID, ids=[s.hex() for s in INVALID])
def test_an_invalid_sequence_is_found_at_every_position(seq: bytes) -> None:
    assert len(BASE) > 64
    raws = [BASE[:i] + seq + BASE[i:] for i in range(len(BASE) + 1)]
    for raw in raws:  # one message each: the message, not the batch, is what fails
        check([string(b"fine"), string(raw)], ONE, [[b"fine"], [raw]])


def test_edges_of_each_sequence_length_are_valid_everywhere() -> None:
    for edge in EDGES:
        e = edge.encode()
        raws = [BASE[:i] + e + BASE[i:] for i in range(0, len(BASE) + 1, 3)]
        check([string(r) for r in raws], ONE, [[r] for r in raws])


@pytest.mark.parametrize("length", [15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97])
def test_lengths_at_the_vector_width(length: int) -> None:
    """A multi-byte character across each block boundary, and a bad byte as the last one."""
    raws = []
    for char in ("é", "€", "😀"):
        for at in range(max(0, length - 8), length):
            text = ("a" * at + char).encode()[:length]
            raws.append(text + b"a" * (length - len(text)))
    for raw in raws:
        check([string(raw)], ONE, [[raw]])
        check([string(raw[:-1] + b"\xc3")], ONE, [[raw[:-1] + b"\xc3"]])
        check([string(raw[:-1] + b"\x80")], ONE, [[raw[:-1] + b"\x80"]])


def test_a_character_split_between_two_strings_is_invalid() -> None:
    """Strings are checked one by one, not as the bytes they make back to back in their column:
    a lead byte ending one string and its continuations starting the next (the next item of
    an array, or the same field of the next message) make two invalid strings."""
    euro = "€".encode()
    for cut in (1, 2):
        a, b = b"x" * 40 + euro[:cut], euro[cut:] + b"y" * 40
        check([string(a), string(b)], ONE, [[a], [b]])  # adjacent in the column
        items = zigzag(2) + string(a) + string(b) + b"\x00"
        with pytest.raises(AvroDecodeError, match=r"^message 0 .*invalid UTF-8"):
            decode([items], LIST)
        check([string(b"ok"), string(a + b)], ONE, [[b"ok"], [a + b]])  # whole: fine
    # two columns side by side are never adjacent bytes either
    check([string(b"x" * 40 + euro[:1]) + string(euro[1:])], TWO,
          [[b"x" * 40 + euro[:1], euro[1:]]])


@pytest.mark.parametrize("empties", [False, True])
def test_a_split_character_is_found_among_many_strings(empties: bool) -> None:
    """The first bytes of a column's strings are looked at 8 at a time, then one by one: a
    string starting on a continuation (the valid bytes of a character split with the string
    before) at every position of 1 to 25 strings, empty strings between them and last too."""
    euro = "€".encode()
    for count in range(1, 26):
        for split in range(1, count):
            raws = [f"é{k}".encode() for k in range(count)]
            raws[split - 1] += euro[:1]
            raws[split] = euro[1:] + raws[split]
            if empties:
                raws = [r for raw in raws for r in (b"", raw)] + [b""]
            check([string(r) for r in raws], ONE, [[r] for r in raws])
            items = zigzag(len(raws)) + b"".join(map(string, raws)) + b"\x00"
            with pytest.raises(AvroDecodeError, match=r"^message 0 .*invalid UTF-8"):
                decode([items], LIST)
        good = [f"é{k}".encode() for k in range(count)] + [b""]
        check([string(r) for r in good], ONE, [[r] for r in good])


def test_the_first_bad_message_of_a_big_batch_is_named() -> None:
    """Past the decoder's deferred checks (every few tens of kilobytes): the message named is
    the first bad one, wherever it is."""
    good = [string(f"{i} Παπαδόπουλος 東京 São Paulo".encode()) for i in range(20_000)]
    for bad in (0, 7_777, 19_999):
        messages = list(good)
        messages[bad] = string(b"caf\xc3" + b"x" * 20)
        with pytest.raises(AvroDecodeError, match=rf"^message {bad} "):
            decode(messages, ONE, threads=2)
    assert len(decode(good, ONE, threads=2)) == 20_000


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=80) | st.text(max_size=40).map(str.encode), min_size=1,
                max_size=6))
def test_random_strings_agree_with_python(raws: list[bytes]) -> None:
    check([string(r) for r in raws], ONE, [[r] for r in raws])


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=60), st.data())
def test_one_flipped_byte_agrees_with_python(text: str, data: st.DataObject) -> None:
    raw = bytearray(text.encode())
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] = data.draw(st.integers(0x80, 0xFF))
    check([string(bytes(raw))], ONE, [[bytes(raw)]])
