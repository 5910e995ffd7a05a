"""The exported surface: exactly these names, all importable, one exception root."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import arrowstash

EXPECTED_ALL = {
    "DEFAULT",
    "ArrowSerializer",
    "ArrowstashError",
    "AvroDecodeError",
    "AvroEncodeError",
    "AvroSchemaError",
    "AvroSerializer",
    "Backend",
    "BackendError",
    "BufferSerializer",
    "ArraySerializer",
    "CacheInfo",
    "CachedFunction",
    "CorruptEntryError",
    "FileBackend",
    "Key",
    "MemcachedBackend",
    "MemoryBackend",
    "ObjectStoreBackend",
    "RedisBackend",
    "SerializationError",
    "Serializer",
    "StandardSerializer",
    "cache",
}

ERRORS = [
    "AvroDecodeError",
    "AvroEncodeError",
    "AvroSchemaError",
    "BackendError",
    "CorruptEntryError",
    "SerializationError",
]


def test_all_is_exactly_the_public_names() -> None:
    assert len(arrowstash.__all__) == len(set(arrowstash.__all__)), "duplicates in __all__"
    assert set(arrowstash.__all__) == EXPECTED_ALL


@pytest.mark.parametrize("name", sorted(EXPECTED_ALL))
def test_every_exported_name_is_importable(name: str) -> None:
    assert getattr(arrowstash, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from arrowstash import {name}", namespace)
    assert namespace[name] is getattr(arrowstash, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from arrowstash import *", namespace)
    assert set(namespace) - {"__builtins__"} == EXPECTED_ALL


def test_version_is_a_string() -> None:
    assert isinstance(arrowstash.__version__, str)
    assert arrowstash.__version__.count(".") >= 1


@pytest.mark.parametrize("name", ERRORS)
def test_errors_share_one_root(name: str) -> None:
    error = getattr(arrowstash, name)
    assert issubclass(error, arrowstash.ArrowstashError)
    assert issubclass(arrowstash.ArrowstashError, Exception)
    with pytest.raises(arrowstash.ArrowstashError):
        raise error("x")


def test_errors_are_the_builtin_kinds_they_document() -> None:
    assert issubclass(arrowstash.SerializationError, TypeError)
    assert issubclass(arrowstash.AvroDecodeError, ValueError)
    assert issubclass(arrowstash.AvroSchemaError, ValueError)
    assert issubclass(arrowstash.AvroEncodeError, ValueError)
    assert not issubclass(arrowstash.BackendError, OSError)


def test_subpackages_export_backends_and_serializers() -> None:
    from arrowstash.backends import FileBackend, MemoryBackend
    from arrowstash.serializers import StandardSerializer

    assert FileBackend is arrowstash.FileBackend
    assert MemoryBackend is arrowstash.MemoryBackend
    assert StandardSerializer is arrowstash.StandardSerializer


def test_backends_and_serializer_satisfy_their_protocols(tmp_path: Path) -> None:
    assert isinstance(arrowstash.MemoryBackend(), arrowstash.Backend)
    assert isinstance(arrowstash.FileBackend(tmp_path / "c"), arrowstash.Backend)
    assert isinstance(arrowstash.StandardSerializer(), arrowstash.Serializer)


@pytest.mark.parametrize(
    "module", ["arrowstash.backends", "arrowstash.serializers", "arrowstash.errors"]
)
def test_submodule_all_names_exist(module: str) -> None:
    mod = importlib.import_module(module)
    for name in getattr(mod, "__all__", []):
        assert hasattr(mod, name), f"{module}.__all__ names missing {name}"


def test_importing_arrowstash_loads_no_dataframe_library() -> None:
    """pyarrow, pandas, polars and NumPy are imported on first use, not by ``import arrowstash``."""
    code = (
        "import sys, arrowstash\n"
        "print(sorted(m for m in ('pyarrow', 'pandas', 'polars', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_arrow_serializer_is_exported_lazily() -> None:
    from arrowstash.serializers import ArrowSerializer

    assert arrowstash.ArrowSerializer is ArrowSerializer
    assert isinstance(ArrowSerializer(), arrowstash.Serializer)


def test_avro_serializer_is_exported_lazily() -> None:
    from arrowstash.serializers import AvroSerializer

    assert arrowstash.AvroSerializer is AvroSerializer
    assert isinstance(AvroSerializer(), arrowstash.Serializer)
