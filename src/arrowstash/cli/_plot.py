"""Charts of what ``demo`` and ``bench`` measured: grouped bars, one group per job or value,
on a log scale (a hit and a miss differ by orders of magnitude). matplotlib is the ``plot``
extra, imported when a chart is asked for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from arrowstash.cli._output import human_time


def check() -> None:
    """Fail at once, before any work, when matplotlib is missing."""
    import matplotlib  # noqa: F401


def bars(path: str, groups: Sequence[str], series: Mapping[str, Sequence[float]],
         title: str) -> None:
    """Write a PNG (or any format matplotlib knows by ``path``'s extension) with one bar per
    series in each group; values are seconds, drawn in milliseconds."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups)), 4), layout="constrained")
    for i, (name, seconds) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        drawn = ax.bar([x + offset for x in range(len(groups))], [s * 1e3 for s in seconds],
                       width, label=name)
        ax.bar_label(drawn, [human_time(s) if s == s else "n/a" for s in seconds],  # nan: none
                     fontsize=8, padding=2)
    ax.set_xticks(list(range(len(groups))), [g.replace(", ", ",\n") for g in groups])
    ax.set_yscale("log")
    ax.margins(y=0.15)  # room above the tallest bar for its label
    ax.set_ylabel("milliseconds (log scale)")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(series), frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)
