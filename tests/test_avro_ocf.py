"""Object Container Files: every codec both ways against fastavro, corrupt and truncated files
refused with the block and byte offset, projections, resolution and threads."""

from __future__ import annotations

import datetime as dt
import io
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

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


def test_bad_compressed_data_names_its_block(tmp_path: Path) -> None:
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
