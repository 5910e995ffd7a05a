"""Avro fuzzing (issue 20, "the stress suite we keep"): damaged messages and container files of a
few schemas, decoded in a child process (tests/stress/_avro_fuzz.py) by the native decoder on one
and two threads and by the pure-Python one. Targets: no crash, no error but ours, the native and
Python decoders agree on every input (same rows, or both refuse), every input decoded or refused
in well under a second, and a bounded peak RSS.

Quick by default (a few seconds per seed, what CI runs); ``ARROWSTASH_STRESS=full`` fuzzes for two
minutes per seed. The module prints one table of what every seed measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _stress_table import print_table

pytestmark = pytest.mark.slow

FULL = os.environ.get("ARROWSTASH_STRESS") == "full"
SECONDS = 120.0 if FULL else 5.0
CHILD = Path(__file__).with_name("_avro_fuzz.py")
ROWS: list[dict[str, Any]] = []


@pytest.mark.parametrize("seed", [1, 2])
def test_damaged_avro_is_refused_by_our_errors_alike_natively_and_in_python(seed: int) -> None:
    run = subprocess.run([sys.executable, str(CHILD), str(SECONDS), str(seed)],
                         capture_output=True, text=True, timeout=SECONDS * 4 + 60)
    assert run.returncode == 0, f"the fuzzing child died ({run.returncode}): {run.stderr[-2000:]}"
    report = json.loads(run.stdout)
    ROWS.append({"seed": seed, **report, "wrong types": len(report["wrong types"])})
    assert report["calls"] > 1000 and report["ok"] > 0 and report["rejected"] > 0, report
    assert report["wrong types"] == {}, report["wrong types"]
    assert report["differ"] == 0, report["first difference"]
    assert report["slowest s"] < 1.0, report["slowest input"]
    assert report["peak RSS MB"] < 1024, report


@pytest.fixture(scope="module", autouse=True)
def table(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_table(request, ["seed", "calls", "ok", "rejected", "wrong types", "differ", "slowest s",
               "peak RSS MB"], ROWS, digits=3)
