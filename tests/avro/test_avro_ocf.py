"""Object Container Files: every codec both ways against fastavro, corrupt and truncated files
refused with the block and byte offset, projections, resolution and threads."""

from __future__ import annotations

import datetime as dt
import io
import sys
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstash.avro import parse_schema
from arrowstash.avro.ocf import header_of, read_ocf, write_ocf
from arrowstash.errors import AvroDecodeError

fastavro = pytest.importorskip("fastavro")

SCHEMA = {
    "type": "record", "name": "Reading", "namespace": "test",
    "fields": [
        {"name": "station", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "temp", "type": ["null", "double"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    ],
}
EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
RECORDS = [
    {"station": f"st-{i % 17}", "at": EPOCH + dt.timedelta(seconds=i),
     "temp": None if i % 5 == 0 else i / 4, "tags": ["x"] * (i % 3), "kind": "AB"[i % 2]}
    for i in range(2_000)
]
FASTAVRO_CODECS = ["null", "deflate", "snappy", "bzip2", "xz"]  # its zstandard needs a backport


def _fastavro_file(path: Path, codec: str, records: list[dict[str, Any]] = RECORDS,
                   block: int = 300) -> Path:
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(SCHEMA), records, codec=codec,
                        sync_interval=block * 20)
    return path


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


@pytest.mark.parametrize("codec", FASTAVRO_CODECS)
def test_reads_what_fastavro_writes(tmp_path: Path, codec: str) -> None:
    path = _fastavro_file(tmp_path / "f.avro", codec)
    table = read_ocf(path)
    assert table.schema == parse_schema(SCHEMA).arrow_schema
    assert _rows(table) == RECORDS
    assert _rows(read_ocf(path, threads=1)) == RECORDS
    with open(path, "rb") as f:
        assert _rows(read_ocf(f)) == RECORDS
    assert _rows(read_ocf(path.read_bytes())) == RECORDS


@pytest.mark.parametrize("codec", [*FASTAVRO_CODECS, "zstd"])
def test_fastavro_reads_what_we_write(tmp_path: Path, codec: str) -> None:
    table = read_ocf(_fastavro_file(tmp_path / "in.avro", "null"))
    out = tmp_path / "out.avro"
    write_ocf(table, out, codec=codec, block_bytes=4096)  # many blocks
    assert header_of(out).codec == ("zstandard" if codec == "zstd" else codec)
    assert _rows(read_ocf(out)) == RECORDS
    if codec != "zstd":
        with open(out, "rb") as f:
            reader = fastavro.reader(f)
            assert list(reader) == RECORDS
            assert reader.writer_schema["name"] == "test.Reading"


def test_write_derives_the_schema_and_keeps_user_metadata(tmp_path: Path) -> None:
    table = pa.table({"n": pa.array([1, 2, None], pa.int64()), "s": ["a", "b", "c"]})
    out = tmp_path / "t.avro"
    write_ocf(table, out, codec="deflate", metadata={"origin": b"unit test"})
    assert header_of(out).metadata["origin"] == b"unit test"
    with open(out, "rb") as f:
        assert list(fastavro.reader(f)) == [{"n": 1, "s": "a"}, {"n": 2, "s": "b"},
                                            {"n": None, "s": "c"}]
    with pytest.raises(ValueError, match="reserved"):
        write_ocf(table, io.BytesIO(), metadata={"avro.codec": b"x"})
    with pytest.raises(ValueError, match="unknown Avro codec 'lz4'"):
        write_ocf(table, io.BytesIO(), codec="lz4")


def test_columns_and_reader_schema(tmp_path: Path) -> None:
    path = _fastavro_file(tmp_path / "f.avro", "deflate")
    assert read_ocf(path, columns=["temp", "station"]).column_names == ["temp", "station"]
    with pytest.raises(KeyError, match="nope"):
        read_ocf(path, columns=["nope"])
    reader = {**SCHEMA, "fields": [
        {"name": "station", "type": "bytes"},
        {"name": "elevation", "type": "int", "default": 12},
    ]}
    resolved = read_ocf(path, reader_schema=reader)
    assert resolved.column_names == ["station", "elevation"]
    assert resolved.column("station")[3].as_py() == b"st-3"
    assert set(resolved.column("elevation").to_pylist()) == {12}


def test_empty_file_gives_an_empty_table(tmp_path: Path) -> None:
    path = _fastavro_file(tmp_path / "f.avro", "null", records=[])
    table = read_ocf(path)
    assert table.num_rows == 0
    assert table.schema == parse_schema(SCHEMA).arrow_schema


# -- broken files --------------------------------------------------------------------------------

def _valid(tmp_path: Path) -> bytes:
    return _fastavro_file(tmp_path / "v.avro", "null", RECORDS[:50], block=10).read_bytes()


def test_every_truncation_is_refused_or_reads_a_prefix(tmp_path: Path) -> None:
    data = _valid(tmp_path)
    for cut in range(len(data) - 1, 0, -7):
        try:
            table = read_ocf(data[:cut])
        except AvroDecodeError as exc:
            assert "byte" in str(exc) or "Avro object container" in str(exc)
        else:  # a cut exactly between blocks is a shorter valid file
            assert _rows(table) == RECORDS[: table.num_rows]


def test_truncation_names_block_and_offset(tmp_path: Path) -> None:
    data = _valid(tmp_path)
    with pytest.raises(AvroDecodeError, match=r"block \d+ at byte \d+: file ends inside"):
        read_ocf(data[:-3])


def test_a_bad_datum_names_its_block_and_where_the_block_starts(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path))
    start = header_of(bytes(data)).size
    data[start + 3] = 0x7F  # the first datum's string length (after count and size): -64
    with pytest.raises(AvroDecodeError, match=rf"block 0.*\(block 0 starts at byte {start} "):
        read_ocf(bytes(data))


def test_a_wrong_sync_marker_names_its_block(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path))
    data[-1] ^= 0xFF
    with pytest.raises(AvroDecodeError, match=r"block \d+ at byte \d+: the sync marker at byte "
                                              rf"{len(data) - 16} does not match"):
        read_ocf(bytes(data))


def test_bad_compressed_data_names_its_block(tmp_path: Path, inflate: str) -> None:
    path = _fastavro_file(tmp_path / "d.avro", "deflate", RECORDS[:50], block=10)
    data = bytearray(path.read_bytes())
    header = header_of(path)
    start = header.size
    data[start + 3] = 0xFF  # the first block's deflate stream: a reserved block type
    with pytest.raises(AvroDecodeError, match=r"block 0 at byte \d+: cannot deflate-decompress"):
        read_ocf(bytes(data))


def test_snappy_crc_is_checked(tmp_path: Path) -> None:
    path = _fastavro_file(tmp_path / "s.avro", "snappy", RECORDS[:50], block=100)
    data = bytearray(path.read_bytes())
    data[-17] ^= 0x01  # last byte of the last block's CRC
    with pytest.raises(AvroDecodeError, match="CRC-32"):
        read_ocf(bytes(data))


def test_not_a_container_file() -> None:
    with pytest.raises(AvroDecodeError, match="not an Avro object container file"):
        read_ocf(b"PAR1....")
    with pytest.raises(AvroDecodeError, match="version 0"):
        read_ocf(b"Obj\x00rest")
    with pytest.raises(AvroDecodeError, match="header at byte"):
        read_ocf(b"Obj\x01\x04")


def test_deflate_is_raw_zlib(tmp_path: Path) -> None:
    """The spec's deflate is RFC 1951 without the zlib wrapper: check our blocks are."""
    out = io.BytesIO()
    write_ocf(read_ocf(_fastavro_file(tmp_path / "f.avro", "null")), out, codec="deflate")
    data = out.getvalue()
    header = header_of(data)
    body = data[header.size:]
    # count (varint), size (varint), then the raw deflate stream
    pos = 0
    while body[pos] & 0x80:
        pos += 1
    pos += 1
    size = shift = 0
    while True:
        byte = body[pos]
        size |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            break
        shift += 7
    size >>= 1
    zlib.decompress(body[pos : pos + size], -15)


def test_the_package_exports_every_name_it_lists() -> None:
    import arrowstash.avro as avro

    for name in avro.__all__:
        assert getattr(avro, name) is not None, name
    assert avro.read_ocf is read_ocf and avro.write_ocf is write_ocf


# -- compressed files: one run of blocks per thread; libdeflate, ISA-L or zlib inflate -----------

@pytest.mark.parametrize("codec", ["deflate", "snappy", "bzip2"])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_runs_of_blocks_read_like_one_thread(tmp_path: Path, codec: str, threads: int,
                                             inflate: str) -> None:
    path = _fastavro_file(tmp_path / "f.avro", codec, block=37)  # 55 blocks of uneven size
    table = read_ocf(path, threads=threads)
    assert _rows(table) == RECORDS
    assert table.num_rows == read_ocf(path, threads=1).num_rows
    assert 1 < len(table.to_batches()) <= threads  # one batch per run
    picked = read_ocf(path, threads=threads, columns=["kind", "station"])
    assert picked.column_names == ["kind", "station"] and picked.num_rows == len(RECORDS)


def test_runs_split_blocks_in_order_by_compressed_bytes() -> None:
    from arrowstash.avro.ocf import _Block, _runs

    blocks = [_Block(i, 0, 1, memoryview(b"x" * size)) for i, size in
              enumerate([5, 1, 1, 1, 9, 2, 2, 2, 2, 1])]
    for n in range(1, 12):
        runs = _runs(blocks, n)
        assert [b.index for run in runs for b in run] == list(range(len(blocks)))
        assert 1 <= len(runs) <= n and all(runs)
    assert [len(run) for run in _runs(blocks, 2)] == [5, 5]  # 17 and 9 of 26 bytes


def _deflated_file(path: Path, corrupt: dict[int, bytes]) -> bytes:
    """``path``'s (uncompressed) blocks deflated again, block i's payload starting with
    ``corrupt[i]`` instead of its own first bytes."""
    from arrowstash.avro.ocf import _blocks, _header_bytes, _long, read_header

    data = memoryview(path.read_bytes())
    header = read_header(data)
    blocks, _ = _blocks(data, header)
    out = _header_bytes({**header.metadata, "avro.codec": b"deflate"}, header.sync)
    for block in blocks:
        payload = bytes(block.data)
        payload = corrupt.get(block.index, b"") + payload[len(corrupt.get(block.index, b"")):]
        squeeze = zlib.compressobj(6, zlib.DEFLATED, -15)
        body = squeeze.compress(payload) + squeeze.flush()
        out += _long(block.count) + _long(len(body)) + body + header.sync
    return out


def test_a_bad_block_in_a_later_run_is_reported_by_its_file_index(tmp_path: Path,
                                                                  inflate: str) -> None:
    path = _fastavro_file(tmp_path / "d.avro", "null", block=37)
    assert _rows(read_ocf(_deflated_file(path, {}), threads=2)) == RECORDS
    data = bytearray(_deflated_file(path, {}))
    header = header_of(bytes(data))
    from arrowstash.avro.ocf import _blocks

    block = _blocks(memoryview(bytes(data)), header)[0][40]
    data[block.offset + 3] = 0xFF  # past its two varints: a reserved deflate block type
    with pytest.raises(AvroDecodeError, match=r"^block 40 at byte \d+: cannot deflate-decompress"):
        read_ocf(bytes(data), threads=2)


def test_a_bad_datum_in_a_later_run_names_its_file_block(tmp_path: Path, inflate: str) -> None:
    path = _fastavro_file(tmp_path / "n.avro", "null", block=37)
    data = _deflated_file(path, {40: b"\x7f"})  # the first station's length: -64
    with pytest.raises(AvroDecodeError,
                       match=r"^block 40, datum 0 .*\(block 40 starts at byte \d+ "):
        read_ocf(data, threads=2)


def test_libdeflate_is_used_where_the_system_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes.util

    from arrowstash.avro import writer_decoder as codec

    if codec._cdecode is None:
        pytest.skip("the native Avro decoder is not built")
    assert codec._cdecode.native_inflate() == (ctypes.util.find_library("deflate") is not None)
    monkeypatch.setenv("ARROWSTASH_AVRO_LIBDEFLATE", "0")
    assert not codec.native_inflate_available()


def test_blocks_that_inflate_far_past_their_size(tmp_path: Path, inflate: str) -> None:
    """Blocks of 4 MB that deflate to a few kB: the native inflater's buffer grows and
    inflates again until each fits (the native call itself succeeds: a failure would be
    retried by Python)."""
    schema = {"type": "record", "name": "Big", "fields": [{"name": "s", "type": "string"}]}
    records = [{"s": chr(65 + i % 26) * (1 << 20)} for i in range(12)]
    path = tmp_path / "big.avro"
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(schema), records, codec="deflate",
                        sync_interval=4 << 20)
    assert len(path.read_bytes()) < 100_000
    for threads in (1, 2):
        assert _rows(read_ocf(path, threads=threads)) == records
    if inflate == "native":
        from arrowstash.avro.ocf import _blocks, read_header
        from arrowstash.avro.writer_decoder import decode_deflated

        data = memoryview(path.read_bytes())
        blocks, _ = _blocks(data, read_header(data))
        batch = decode_deflated([b.data for b in blocks], [b.count for b in blocks], schema)
        assert batch is not None and batch.to_pylist() == records


#: A deflate stream's input, its level, and up to three bytes of it overwritten.
_DAMAGED_STREAMS = {
    "payload": st.binary(max_size=3000) | st.text(max_size=500).map(str.encode),
    "level": st.integers(0, 9),
    "flips": st.lists(st.tuples(st.integers(0), st.integers(0, 255)), max_size=3),
}


@settings(max_examples=150, deadline=None)
@given(**_DAMAGED_STREAMS)
def test_native_inflate_reads_what_python_inflate_reads(payload: bytes, level: int,
                                                        flips: list[tuple[int, int]]) -> None:
    """A one-block deflate file of one ``bytes`` datum, its stream damaged or not: the same
    value, or the same error, whoever inflates."""
    from arrowstash.avro.ocf import _header_bytes, _long
    from arrowstash.avro.writer_decoder import native_inflate_available

    if not native_inflate_available():
        pytest.skip("the native decoder is not built or the system has no libdeflate")
    schema = '{"type": "record", "name": "B", "fields": [{"name": "b", "type": "bytes"}]}'
    squeeze = zlib.compressobj(level, zlib.DEFLATED, -15)
    stream = bytearray(squeeze.compress(_long(len(payload)) + payload) + squeeze.flush())
    for at, value in flips:
        stream[at % len(stream)] = value
    sync = bytes(range(16))
    data = (_header_bytes({"avro.schema": schema.encode(), "avro.codec": b"deflate"}, sync)
            + _long(1) + _long(len(stream)) + bytes(stream) + sync)
    outcomes = []
    for native in ("1", "0"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ARROWSTASH_AVRO_LIBDEFLATE", native)
            try:
                outcomes.append(_rows(read_ocf(data, threads=2)))
            except AvroDecodeError as exc:
                outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    if not flips:
        assert outcomes[0] == [{"b": payload}]


def _zlib_inflate(data: bytes) -> bytes | str:
    try:
        return zlib.decompress(data, -15)
    except zlib.error:
        return "error"


@settings(max_examples=300, deadline=None)
@given(**_DAMAGED_STREAMS)
def test_isal_inflates_exactly_like_zlib(payload: bytes, level: int,
                                         flips: list[tuple[int, int]]) -> None:
    """Same bytes out for every stream, and a corrupt stream refused by both or by neither."""
    pytest.importorskip("isal")
    from arrowstash.avro.ocf_codecs import Corrupt as _Corrupt
    from arrowstash.avro.ocf_codecs import _inflate

    squeeze = zlib.compressobj(level, zlib.DEFLATED, -15)
    stream = bytearray(squeeze.compress(payload) + squeeze.flush())
    for at, value in flips:
        stream[at % len(stream)] = value
    expected = _zlib_inflate(bytes(stream))
    try:
        got: bytes | str = _inflate(memoryview(bytes(stream)))
    except _Corrupt:
        got = "error"
    assert got == expected
    if not flips:
        assert got == payload


def test_deflate_reads_with_zlib_when_isal_is_not_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from arrowstash.avro import ocf_codecs

    path = _fastavro_file(tmp_path / "d.avro", "deflate", block=37)
    monkeypatch.setitem(sys.modules, "isal", None)  # what an absent package looks like to import
    ocf_codecs.inflater.cache_clear()
    try:
        assert ocf_codecs.inflater()[1] == (zlib.error,)
        assert _rows(read_ocf(path, threads=2)) == RECORDS
        assert _rows(read_ocf(path, threads=1)) == RECORDS
    finally:
        ocf_codecs.inflater.cache_clear()


def test_a_damaged_header_schema_is_a_decode_error(tmp_path: Path) -> None:
    from arrowstash.avro.ocf import _header_bytes

    body = _fastavro_file(tmp_path / "f.avro", "null", RECORDS[:3]).read_bytes()
    header = header_of(body)
    for schema, message in ((b"\xff{", "avro.schema is not UTF-8"),
                            (b'{"type": "record"', "invalid schema: schema is not valid JSON"),
                            (b'{"type": "recrod", "name": "R"}', "invalid schema: .*'recrod'")):
        damaged = _header_bytes({**header.metadata, "avro.schema": schema}, header.sync)
        with pytest.raises(AvroDecodeError, match=message):
            read_ocf(damaged + body[header.size :])


def test_the_native_block_scan_finds_what_the_python_one_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same blocks and the same first problem, whether the C scanner walks the good blocks
    first or not: every truncation, a bad sync marker, negative and over-long varints."""
    from arrowstash.avro import writer_decoder as codec
    from arrowstash.avro.ocf import _blocks, _long, read_header

    if codec._cdecode is None:
        pytest.skip("the native Avro decoder is not built")
    data = _valid(tmp_path)
    header = read_header(memoryview(data))
    first = header.size
    second = first + len(_long(10))  # the first block's size varint starts here
    cases = [data[:cut] for cut in range(len(data), first, -3)]
    broken = [data[:first] + _long(-1) + data[second:],  # negative count
              data[:second] + _long(-5) + data[second + 2:],  # negative size
              data[:second] + b"\xff" * 10 + b"\x01" + data[second + 2:],  # 11-byte varint
              data[:second] + b"\xff" * 9 + b"\x7f" + data[second + 2:],  # 10th byte too big
              data[:-1] + bytes([data[-1] ^ 1])]  # the last sync marker
    for case in cases + broken:
        found = []
        for native in ("1", "0"):
            monkeypatch.setenv("ARROWSTASH_AVRO_NATIVE", native)
            blocks, error = _blocks(memoryview(case), header)
            found.append(([(b.index, b.offset, b.count, bytes(b.data)) for b in blocks],
                          str(error)))
        assert found[0] == found[1]
        assert case not in broken or "block" in found[0][1]  # each is an error
