"""The ``arrowstash`` command: run the demo, inspect or purge a cache, benchmark a backend."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence

from arrowstash import backends
from arrowstash.backends.base import Backend
from arrowstash.cli import avro as avro_cli
from arrowstash.cli import verify as verify_cli
from arrowstash.cli._output import human_age, human_size, progress
from arrowstash.entry.format import Key
from arrowstash.entry.listing import EntryInfo
from arrowstash.errors import ArrowstashError


def _backend(url: str | None) -> Backend:
    return backends.from_url(url) if url else backends.default_backend()


def cmd_info(args: argparse.Namespace) -> int:
    backend = _backend(args.url)
    entries = list(progress(backend.entries(), "reading entries"))
    now = time.time()
    stats = backend.stats()
    print(f"backend     {backend!r}")
    print(f"entries     {len(entries)} readable, {stats['entries']} files")
    print(f"size        {human_size(stats['bytes'])}")
    if stats.get("max_bytes"):
        print(f"max size    {human_size(stats['max_bytes'])}")
    print(f"expired     {sum(0 < e.expires <= now for e in entries)}")
    by_ns = Counter(e.namespace for e in entries)
    for namespace, count in sorted(by_ns.items()):
        size = sum(e.size for e in entries if e.namespace == namespace)
        print(f"namespace   {namespace}: {count} entries, {human_size(size)}")
    by_ser = Counter(e.serializer for e in entries)
    print("serializers " + ", ".join(f"{k}: {v}" for k, v in sorted(by_ser.items())))
    by_fn = Counter((e.namespace, e.function) for e in entries)
    for (namespace, function), count in sorted(by_fn.items()):
        mine = [e for e in entries if (e.namespace, e.function) == (namespace, function)]
        expired = sum(0 < e.expires <= now for e in mine)
        print(f"function    {namespace}/{function}: {count} entries, "
              f"{human_size(sum(e.size for e in mine))}, {expired} expired, "
              f"newest {human_age(now - max(e.created for e in mine))} old")
    if "breaker" in stats:
        print(f"breaker     {stats['breaker']}")
    server = stats.get("server")
    if server:  # the server's own counters, of every client
        hits, misses = server.get("hits", 0), server.get("misses", 0)
        ratio = f" ({hits / (hits + misses):.1%} hits)" if hits + misses else ""
        print("server      " + ", ".join(
            f"{name} {human_size(value) if name == 'memory' else value}"
            for name, value in server.items()) + ratio)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    backend = _backend(args.url)
    now = time.time()
    rows = sorted(
        backend.entries(args.namespace), key=lambda e: (e.namespace, e.function, -e.created)
    )
    print(f"{'namespace':<12} {'function':<40} {'key':<14} {'serializer':<10} {'size':>10} "
          f"{'age':>7} {'expires':>8}")
    for e in rows:
        if e.expires == 0.0:
            expires = "never"
        elif e.expires <= now:
            expires = "expired"
        else:
            expires = "in " + human_age(e.expires - now)
        print(f"{e.namespace:<12} {e.function:<40} {e.key[:12]:<14} {e.serializer:<10} "
              f"{human_size(e.size):>10} {human_age(now - e.created):>7} {expires:>8}")
    print(f"{len(rows)} entries, {human_size(sum(e.size for e in rows))}")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    backend = _backend(args.url)
    if args.all:
        removed = backend.clear()
    elif args.namespace:
        removed = backend.clear(args.namespace)
    else:
        now = time.time()
        expired: list[EntryInfo] = [e for e in backend.entries() if 0 < e.expires <= now]
        removed = sum(
            backend.delete(Key(e.namespace, e.function, bytes.fromhex(e.key)))
            for e in progress(expired, "deleting expired entries")
        )
    print(f"removed {removed} entries")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from arrowstash.cli.demo import run

    return run(args.dir)


def cmd_bench(args: argparse.Namespace) -> int:
    from arrowstash.cli.bench import VALUES, run

    if args.repeats < 1 or args.rows < 1 or args.mib < 1:
        raise ValueError("--repeats, --rows and --mib must be positive")
    return run(_backend(args.url), args.value or list(VALUES), args.rows, args.mib, args.repeats)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arrowstash", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="cache a real computation on the embedded File backend")
    demo.add_argument("--dir", help="cache folder (default: a temporary folder)")
    demo.set_defaults(run=cmd_demo)
    url_help = "backend URL (default: $ARROWSTASH_URL or the user's cache folder)"
    info = sub.add_parser("info", help="summarise a cache")
    info.add_argument("url", nargs="?", help=url_help)
    info.set_defaults(run=cmd_info)
    ls = sub.add_parser("ls", help="list entries")
    ls.add_argument("url", nargs="?", help=url_help)
    ls.add_argument("--namespace", help="only this namespace")
    ls.set_defaults(run=cmd_ls)
    purge = sub.add_parser("purge", help="delete entries")
    purge.add_argument("url", nargs="?", help=url_help)
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--expired", action="store_true", help="entries past their TTL")
    which.add_argument("--namespace", help="every entry of a namespace")
    which.add_argument("--all", action="store_true", help="every arrowstash entry")
    purge.set_defaults(run=cmd_purge)
    bench = sub.add_parser("bench", help="time stores and hits of typical values on a backend")
    bench.add_argument("url", nargs="?", help=url_help)
    bench.add_argument("--value", action="append", choices=("small", "frame", "array"),
                       help="what to cache (repeatable; default: all three)")
    bench.add_argument("--rows", type=int, default=1_000_000, help="rows of the frame")
    bench.add_argument("--mib", type=int, default=256, help="size of the float64 array, MiB")
    bench.add_argument("--repeats", type=int, default=5, help="stores per value (3 hits each)")
    bench.set_defaults(run=cmd_bench)
    avro_cli.register(sub)
    verify_cli.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, OSError, ArrowstashError) as exc:
        print(f"arrowstash: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
