"""``arrowstash avro decode | encode | cat`` on real files, checked against fastavro."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest

from arrowstash.cli.main import main

fastavro = pytest.importorskip("fastavro")

SCHEMA = {
    "type": "record", "name": "Trip", "namespace": "taxi",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "driver", "type": ["null", "string"], "default": None},
        {"name": "km", "type": "double"},
        {"name": "stops", "type": {"type": "array", "items": "string"}},
    ],
}
RECORDS = [{"id": i, "driver": None if i % 4 == 0 else f"d{i % 7}", "km": i / 3,
            "stops": [f"s{j}" for j in range(i % 3)]} for i in range(250)]


def _run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _messages() -> list[bytes]:
    parsed = fastavro.parse_schema(SCHEMA)
    out = []
    for record in RECORDS:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        out.append(buffer.getvalue())
    return out


@pytest.fixture
def avsc(tmp_path: Path) -> Path:
    path = tmp_path / "trip.avsc"
    path.write_text(json.dumps(SCHEMA))
    return path


def _kcat_file(path: Path, messages: list[bytes]) -> Path:
    """What ``kcat -C -f '%R%s'`` writes: each message after its 4-byte big-endian length."""
    path.write_bytes(b"".join(struct.pack(">I", len(m)) + m for m in messages))
    return path


def test_decode_length_prefixed_messages_to_parquet(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _kcat_file(tmp_path / "trips.bin", _messages())
    code, out, _ = _run(capsys, "avro", "decode", "--schema", avsc, source,
                        "-o", tmp_path / "trips.parquet")
    assert code == 0 and "decoded 250 messages" in out
    assert pq.read_table(tmp_path / "trips.parquet").to_pylist() == RECORDS


def test_decode_confluent_framed_messages_from_a_binary_column(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    framed = [b"\x00" + struct.pack(">i", 42) + m for m in _messages()]
    pq.write_table(pa.table({"key": [str(i) for i in range(250)],
                             "value": pa.array(framed, pa.binary())}), tmp_path / "dump.parquet")
    code, _, _ = _run(capsys, "avro", "decode", "--schema", avsc, "--confluent",
                      tmp_path / "dump.parquet", "-o", tmp_path / "trips.arrow")
    assert code == 0
    with pa.memory_map(str(tmp_path / "trips.arrow")) as source:
        assert pa.ipc.open_file(source).read_all().to_pylist() == RECORDS
    code, _, err = _run(capsys, "avro", "decode", "--schema", avsc,
                        tmp_path / "dump.parquet", "-o", tmp_path / "garbage.arrow")
    assert code == 2  # the unstripped header is not decoded as data
    assert "arrowstash: error:" in err


def test_unframed_messages_with_confluent_name_the_message(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = _messages()
    framed = [b"\x00\x00\x00\x00\x07" + m for m in messages[:3]] + messages[3:]
    source = _kcat_file(tmp_path / "mixed.bin", framed)
    code, _, err = _run(capsys, "avro", "decode", "--schema", avsc, "--confluent", source,
                        "-o", tmp_path / "out.parquet")
    assert code == 2
    assert "message 3" in err and "confluent header" in err
    assert not (tmp_path / "out.parquet").exists()


def test_truncated_message_file_is_an_error(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _kcat_file(tmp_path / "trips.bin", _messages())
    source.write_bytes(source.read_bytes()[:-5])
    code, _, err = _run(capsys, "avro", "decode", "--schema", avsc, source,
                        "-o", tmp_path / "out.parquet")
    assert code == 2
    assert "message 249" in err and "past the end of the file" in err


def test_encode_to_messages_and_back(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = pa.Table.from_pylist(RECORDS)
    pq.write_table(table, tmp_path / "in.parquet")
    code, out, _ = _run(capsys, "avro", "encode", tmp_path / "in.parquet", "--schema", avsc,
                        "--framing", "confluent", "--schema-id", "7", "-o", tmp_path / "out.bin")
    assert code == 0 and "wrote 250 messages" in out
    data = (tmp_path / "out.bin").read_bytes()
    expected = b"".join(struct.pack(">I", len(m) + 5) + b"\x00" + struct.pack(">i", 7) + m
                        for m in _messages())
    assert data == expected  # byte for byte what fastavro writes, framed as kcat reads it
    code, _, _ = _run(capsys, "avro", "decode", "--schema", avsc, "--confluent",
                      tmp_path / "out.bin", "-o", tmp_path / "back.parquet")
    assert code == 0
    assert pq.read_table(tmp_path / "back.parquet").to_pylist() == RECORDS


def test_encode_a_container_file_and_cat_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pyarrow.csv.write_csv(pa.table({"city": ["Oslo", "Lima", "Pune"], "pop": [709, 10_000, 7_000]}),
                     tmp_path / "cities.csv")
    code, out, _ = _run(capsys, "avro", "encode", tmp_path / "cities.csv",
                        "-o", tmp_path / "cities.avro", "--codec", "deflate")
    assert code == 0 and "wrote 3 records" in out
    with open(tmp_path / "cities.avro", "rb") as f:
        assert list(fastavro.reader(f)) == [{"city": "Oslo", "pop": 709},
                                            {"city": "Lima", "pop": 10_000},
                                            {"city": "Pune", "pop": 7_000}]
    code, out, _ = _run(capsys, "avro", "cat", tmp_path / "cities.avro", "-n", "2")
    assert code == 0
    lines = out.splitlines()
    assert "codec    deflate" in lines and "records  3" in lines
    table_at = lines.index("") + 1
    assert lines[table_at].split() == ["city", "pop"]
    assert lines[table_at + 1].split() == ["Oslo", "709"]
    assert lines[table_at + 2].split() == ["Lima", "10000"]
    assert lines[table_at + 3] == "... 1 more"


def test_nested_columns_cannot_go_to_csv(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _kcat_file(tmp_path / "trips.bin", _messages())
    code, _, err = _run(capsys, "avro", "decode", "--schema", avsc, source,
                        "-o", tmp_path / "trips.csv")
    assert code == 2 and "cannot write these columns to .csv" in err
    assert not (tmp_path / "trips.csv").exists()


def test_cat_of_a_broken_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.avro").write_bytes(b"Obj\x01\x02")
    code, _, err = _run(capsys, "avro", "cat", tmp_path / "x.avro")
    assert code == 2 and "header at byte" in err


def test_single_object_framing_round_trip(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "in.parquet")
    code, _, _ = _run(capsys, "avro", "encode", tmp_path / "in.parquet", "--schema", avsc,
                      "--framing", "single-object", "-o", tmp_path / "out.bin")
    assert code == 0
    first = (tmp_path / "out.bin").read_bytes()[4:14]
    assert first[:2] == b"\xc3\x01"  # the fingerprint follows: checked on the way back
    code, _, _ = _run(capsys, "avro", "decode", "--schema", avsc, "--framing", "single-object",
                      tmp_path / "out.bin", "-o", tmp_path / "back.parquet")
    assert code == 0
    assert pq.read_table(tmp_path / "back.parquet").to_pylist() == RECORDS
    other = tmp_path / "other.avsc"
    other.write_text(json.dumps({**SCHEMA, "name": "Other"}))
    code, _, err = _run(capsys, "avro", "decode", "--schema", other, "--framing",
                        "single-object", tmp_path / "out.bin", "-o", tmp_path / "x.parquet")
    assert code == 2 and "schema fingerprint" in err


def test_encode_writes_the_schema_it_derived_and_decode_reads_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = pa.table({"city": ["Oslo", "Lima"], "pop": [709, 10_000]})
    pq.write_table(table, tmp_path / "cities.parquet")
    code, out, _ = _run(capsys, "avro", "encode", tmp_path / "cities.parquet",
                        "-o", tmp_path / "cities.bin")
    beside = tmp_path / "cities.bin.avsc"
    assert code == 0 and f"wrote the writer schema to {beside}" in out
    code, _, _ = _run(capsys, "avro", "decode", "--schema", beside, tmp_path / "cities.bin",
                      "-o", tmp_path / "back.parquet")
    assert code == 0 and pq.read_table(tmp_path / "back.parquet").equals(table)
    code, _, _ = _run(capsys, "avro", "encode", tmp_path / "cities.parquet",
                      "-o", tmp_path / "c.avro", "--schema-out", tmp_path / "c.avsc")
    assert code == 0
    with open(tmp_path / "c.avro", "rb") as f:
        assert json.loads((tmp_path / "c.avsc").read_text()) == fastavro.reader(f).writer_schema


def test_decode_of_a_container_file_points_to_convert(
    tmp_path: Path, avsc: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(tmp_path / "trips.avro", "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(SCHEMA), RECORDS)
    code, out, err = _run(capsys, "avro", "decode", "--schema", avsc, tmp_path / "trips.avro",
                          "-o", tmp_path / "t.parquet")
    assert (code, out) == (2, "")
    assert "is an Avro Object Container File" in err and "arrowstash avro convert" in err
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_convert_a_container_file(
    tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open(tmp_path / "trips.avro", "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(SCHEMA), RECORDS, codec="deflate")
    target = tmp_path / f"trips{suffix}"
    code, out, _ = _run(capsys, "avro", "convert", tmp_path / "trips.avro", "-o", target)
    assert code == 0 and f"converted 250 records (deflate) into {target}" in out
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in target.read_text().splitlines()]
    elif suffix == ".parquet":
        rows = pq.read_table(target).to_pylist()
    else:
        rows = pa.ipc.open_file(pa.memory_map(str(target))).read_all().to_pylist()
    assert rows == RECORDS


def _arrowstash(*argv: Any, native: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ARROWSTASH_AVRO_NATIVE": "1" if native else "0"}
    return subprocess.run([sys.executable, "-m", "arrowstash", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_pure_python_codec_warns_once_per_process(tmp_path: Path, avsc: Path) -> None:
    messages = _kcat_file(tmp_path / "in.bin", _messages())
    for native in (True, False):
        decoded = _arrowstash("avro", "decode", messages, "--schema", avsc, "-o",
                              tmp_path / "out.arrow", native=native)
        assert decoded.returncode == 0, decoded.stderr
        warnings = [line for line in decoded.stderr.splitlines() if "WARNING" in line]
        if native:
            assert warnings == []
        else:
            assert warnings == ["arrowstash: WARNING: Avro codec: pure Python "
                                "(ARROWSTASH_AVRO_NATIVE=0): the same results, about two "
                                "orders of magnitude slower than the native one"]
    # one process encoding, then decoding in several steps: still one warning, on the library's
    # own logger (no handler set: Python prints it to stderr all the same)
    code = ("import pyarrow as pa; from arrowstash.avro import encode, decode; "
            "from arrowstash.avro import from_arrow_schema; "
            "t = pa.table({'a': range(10)}); s = from_arrow_schema(t); m = encode(t, s); "
            "[decode(m, s) for _ in range(3)]")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ARROWSTASH_AVRO_NATIVE": "0"}, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("Avro codec: pure Python") == 1
    version = _arrowstash("--version", native=False)  # names the codec, warns about nothing
    assert "Avro codec: pure Python (ARROWSTASH_AVRO_NATIVE=0)" in version.stdout
    assert version.stderr == ""
