"""``arrowstash verify [URL]``: scrub a cache. Every listed entry is read whole and checked
section by section (its digests; its MACs under ARROWSTASH_SECRET; its AES-GCM tags when
ARROWSTASH_KEY is set), what a mapped hit skips to stay O(1). Damaged entries are reported and
removed (``--keep``: reported only)."""

from __future__ import annotations

import argparse
from typing import Any

from arrowstash import config
from arrowstash.cli._output import human_size, progress
from arrowstash.cli.store import URL_HELP, existing_backend
from arrowstash.entry.format import FLAG_ENCRYPTED, Key, open_encrypted, parse_entry
from arrowstash.entry.listing import EntryInfo
from arrowstash.errors import BackendError, CorruptEntryError


def register(sub: Any) -> None:
    verify = sub.add_parser(
        "verify", help="check every entry's bytes; report and remove damaged ones",
        description="Read every entry whole and check it section by section: its digests, its "
                    "MACs under ARROWSTASH_SECRET, its AES-GCM tags when ARROWSTASH_KEY is set "
                    "(what a mapped hit skips). Damaged entries are reported and removed; exit "
                    "status 1 if any was found.")
    verify.add_argument("url", nargs="?", help=URL_HELP)
    verify.add_argument("--keep", action="store_true", help="report damaged entries only")
    verify.set_defaults(run=run)


def _keyring() -> Any:
    current, previous = config.encryption_keys()
    if not current:
        return None
    from arrowstash.entry.crypto import Keyring

    return Keyring.build(None, (current, previous))


def check(backend: Any, info: EntryInfo, secret: bytes | None, keyring: Any) -> str | None:
    """What is wrong with the entry ``info`` lists ("" if it vanished meanwhile), or None if
    it is sound. Raises BackendError if the store fails."""
    key = Key(info.namespace, info.function, bytes.fromhex(info.key))
    stored = backend.get(key)
    if stored is None:
        return ""
    try:
        entry = parse_entry(stored.data, check_sections=True, secret=secret)
        if entry.key != key:
            raise CorruptEntryError("entry belongs to another key")
        if entry.header.flags & FLAG_ENCRYPTED and keyring is not None:
            open_encrypted(entry, keyring)
    except CorruptEntryError as exc:
        return str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    backend = existing_backend(args.url)
    if not backend.capabilities.lists_entries:
        print(f"{backend!r} cannot list its entries: nothing to verify")
        return 0
    secret, keyring = config.secret(), _keyring()
    checked = damaged = failed = 0
    size = 0
    listed = list(progress(backend.entries(), "listing entries"))
    for info in progress(listed, "verifying entries"):
        try:
            problem = check(backend, info, secret, keyring)
            if problem and not args.keep:
                backend.delete(Key(info.namespace, info.function, bytes.fromhex(info.key)))
        except BackendError as exc:
            failed += 1
            print(f"unreadable {info.namespace}/{info.function} {info.key[:12]}: {exc}")
            continue
        if problem == "":
            continue
        checked += 1
        size += info.size
        if problem is not None:
            damaged += 1
            action = "kept" if args.keep else "removed"
            print(f"damaged    {info.namespace}/{info.function} {info.key[:12]} "
                  f"({human_size(info.size)}, {action}): {problem}")
    print(f"{checked} entries checked ({human_size(size)}), {damaged} damaged"
          + (f", {failed} unreadable" if failed else ""))
    return 1 if damaged or failed else 0
