"""``--plot DIR``: a benchmark's timing tables drawn as bar charts, one PNG per table, from the
same measurements as the printed tables (benchmarks/README.md shows them side by side).

The bars are the CLI's (``arrowstash.cli._plot``): grouped, log scale, labelled in human units;
matplotlib comes with the ``plot`` extra and the test group.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path


def plot_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plot", metavar="DIR", default=None,
                        help="also draw the timing tables as PNG charts in DIR (needs matplotlib)")


def chart(folder: str | None, name: str, title: str, groups: Sequence[str],
          series: Mapping[str, Sequence[float]]) -> None:
    """Write ``DIR/name.png``: one group of bars per entry of ``groups``, one bar per series;
    values in seconds. Nothing without ``--plot``."""
    if folder is None:
        return
    from arrowstash.cli._plot import bars

    path = Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    bars(str(path), groups, series, title)
    print(f"chart: {path}")
