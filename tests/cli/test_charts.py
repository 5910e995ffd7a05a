"""The charts of ``demo --plot``, ``bench --plot`` and the benchmark scripts' ``--plot DIR``:
one shared bar chart helper, which draws what it is given and leaves out what was not measured."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from arrowstash.cli._plot import bars

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bars_draw_a_png_and_skip_what_was_not_measured(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    bars(str(path), ["a", "b"], {"store": [0.01, 0.2], "hit": [1e-5, math.nan]}, "t")
    assert _png(path) and path.stat().st_size > 5_000


def test_a_benchmark_draws_its_tables_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("_charts", BENCHMARKS / "_charts.py")
    assert spec is not None and spec.loader is not None
    charts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(charts)
    charts.chart(None, "none", "t", ["x"], {"hit": [0.1]})
    assert list(tmp_path.iterdir()) == []
    charts.chart(str(tmp_path / "out"), "keys", "t", ["x", "y"], {"hit": [0.1, 0.002]})
    assert _png(tmp_path / "out" / "keys.png")
    assert f"chart: {tmp_path / 'out' / 'keys.png'}" in capsys.readouterr().out
