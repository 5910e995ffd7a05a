"""The one table each stress module prints at its end, whatever pytest captures."""

from __future__ import annotations

from typing import Any

import pytest


def print_table(request: pytest.FixtureRequest, columns: list[str], rows: list[dict[str, Any]],
                digits: int = 1) -> None:
    """A Markdown table of ``rows`` (floats with ``digits`` decimals), printed past capture."""
    lines = ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(f"{row[c]:.{digits}f}" if isinstance(row[c], float)
                                       else str(row[c]) for c in columns) + " |")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n".join(lines))
