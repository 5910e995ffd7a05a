"""``arrowstash info | ls | purge``: look into a cache and tidy it, without creating one."""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from dataclasses import asdict
from typing import Any

from arrowstash.backends.base import Backend
from arrowstash.cli._output import (
    count,
    emit_json,
    human_age,
    human_size,
    progress,
    say,
    table,
    working,
)
from arrowstash.entry.listing import EntryInfo

URL_HELP = "backend URL or folder (default: $ARROWSTASH_URL, else the user's cache folder)"


def register(sub: Any) -> None:
    """Add ``info``, ``ls`` and ``purge`` to the main parser's subparsers."""
    info = sub.add_parser("info", help="summarise a cache",
                          description="Summarise a cache: entries, sizes, expiry, functions.")
    info.add_argument("url", nargs="?", help=URL_HELP)
    info.add_argument("--json", action="store_true", help="print JSON for scripts")
    info.set_defaults(run=cmd_info)
    ls = sub.add_parser("ls", help="list entries", description="List the entries of a cache.")
    ls.add_argument("url", nargs="?", help=URL_HELP)
    ls.add_argument("--namespace", help="only this namespace")
    ls.add_argument("--json", action="store_true", help="print JSON for scripts")
    ls.set_defaults(run=cmd_ls)
    purge = sub.add_parser("purge", help="delete entries",
                           description="Delete expired entries, a namespace, or everything.")
    purge.add_argument("url", nargs="?", help=URL_HELP)
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--expired", action="store_true", help="entries past their TTL")
    which.add_argument("--namespace", help="every entry of a namespace")
    which.add_argument("--all", action="store_true", help="every arrowstash entry")
    purge.set_defaults(run=cmd_purge)


class MissingCache(Exception):
    """The folder a command should read does not exist (it is never created to be read)."""


def existing_backend(url: str | None) -> Backend:
    """The backend ``url`` names (None: the default); a File backend's folder must exist."""
    from arrowstash.backends.registry import default_backend, file_folder, from_url

    folder = file_folder(url)
    if folder is not None and not folder.is_dir():
        raise MissingCache(f"no cache at {folder}: the folder does not exist "
                           "(nothing has been cached there yet)")
    return from_url(url) if url else default_backend()


def _expires(entry: EntryInfo, now: float) -> str:
    if entry.expires == 0.0:
        return "never"
    if entry.expires <= now:
        return "expired"
    return "in " + human_age(entry.expires - now)


def _summary(backend: Backend, entries: list[EntryInfo], now: float) -> dict[str, Any]:
    stats = backend.stats()
    functions: dict[tuple[str, str], list[EntryInfo]] = defaultdict(list)
    for e in entries:
        functions[(e.namespace, e.function)].append(e)
    return {
        "backend": repr(backend),
        "entries": len(entries),
        "files": stats["entries"],
        "bytes": stats["bytes"],
        "max_bytes": stats.get("max_bytes"),
        "expired": sum(0 < e.expires <= now for e in entries),
        "serializers": dict(sorted(Counter(e.serializer for e in entries).items())),
        "functions": [
            {"namespace": ns, "function": fn, "entries": len(mine),
             "bytes": sum(e.size for e in mine),
             "expired": sum(0 < e.expires <= now for e in mine),
             "newest_age": now - max(e.created for e in mine)}
            for (ns, fn), mine in sorted(functions.items())
        ],
        **{name: stats[name] for name in ("breaker", "server") if stats.get(name)},
        "avro_codec": avro_codec(),
    }


def avro_codec() -> str:
    """The Avro codec in use, for people ("native" or "pure Python (why)")."""
    try:
        from arrowstash.avro.decoder import implementation
    except ImportError as exc:  # the base install without NumPy
        return f"unavailable ({exc})"
    return implementation()


def cmd_info(args: argparse.Namespace) -> int:
    backend = existing_backend(args.url)
    now = time.time()
    entries = list(progress(backend.entries(), "reading entries"))
    s = _summary(backend, entries, now)
    if args.json:
        emit_json(s)
        return 0
    lines = [
        ("backend", s["backend"]),
        ("entries", f"{count(s['entries'], 'entry')} readable, {count(s['files'], 'file')}"),
        ("size", human_size(s["bytes"])
         + (f" of {human_size(s['max_bytes'])} at most" if s["max_bytes"] else "")),
        ("expired", str(s["expired"])),
        ("serializers", ", ".join(f"{k}: {v}" for k, v in s["serializers"].items()) or "-"),
        ("avro codec", s["avro_codec"]),
    ]
    if "breaker" in s:
        lines.append(("breaker", str(s["breaker"])))
    if "server" in s:  # the server's own counters, of every client
        lines.append(("server", ", ".join(
            f"{k} {human_size(v) if k == 'memory' else v}" for k, v in s["server"].items())))
    table(("", ""), lines, header=False)
    if s["functions"]:
        say("")
        table(("namespace", "function", "entries", "size", "expired", "newest"),
              [(f["namespace"], f["function"], f["entries"], human_size(f["bytes"]),
                f["expired"], human_age(f["newest_age"]) + " old") for f in s["functions"]],
              right=("entries", "size", "expired", "newest"))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    backend = existing_backend(args.url)
    now = time.time()
    rows = sorted(backend.entries(args.namespace),
                  key=lambda e: (e.namespace, e.function, -e.created))
    if args.json:
        emit_json([{**asdict(e), "expired": 0 < e.expires <= now} for e in rows])
        return 0
    if rows:
        table(("namespace", "function", "key", "serializer", "size", "age", "expires"),
              [(e.namespace, e.function, e.key[:12], e.serializer, human_size(e.size),
                human_age(now - e.created), _expires(e, now)) for e in rows],
              right=("size", "age"))
    say(f"{count(len(rows), 'entry')}, {human_size(sum(e.size for e in rows))}")
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    from arrowstash.entry.format import Key

    backend = existing_backend(args.url)
    if args.all or args.namespace is not None:  # "" is a namespace too
        which = "every entry" if args.all else f"namespace {args.namespace}"
        with working(f"deleting {which}"):
            removed = backend.clear(args.namespace)
    else:
        now = time.time()
        expired = [e for e in progress(backend.entries(), "reading entries")
                   if 0 < e.expires <= now]
        removed = sum(
            backend.delete(Key(e.namespace, e.function, bytes.fromhex(e.key)))
            for e in progress(expired, "deleting expired entries")
        )
    say(f"removed {count(removed, 'entry')}")
    return 0
