"""An in-process backend: a dict of entry bytes. For tests, and for sharing between functions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from arrowstash.backends.base import Capabilities, Held, Stored
from arrowstash.entry.format import EntryWriter, Key
from arrowstash.entry.listing import EntryInfo, describe_buffer


class MemoryBackend:
    """Entries kept as bytes in this process, with expiry. Unbounded: L1 is the bounded one."""

    capabilities = Capabilities(shared=False, remote=False, streams_writes=False,
                                maps_reads=False, lists_entries=True, native_ttl=False)
    encrypt = False  # the bytes never leave the process

    def __init__(self) -> None:
        self._data: dict[Key, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryBackend(<{len(self._data)} entries>)"

    def get(self, key: Key) -> Stored | None:
        item = self._data.get(key)
        if item is None:
            return None
        data, expires = item
        if 0.0 < expires <= time.time():
            with self._lock:
                if self._data.get(key) is item:
                    del self._data[key]
            return None
        return Stored(memoryview(data))

    def set(self, entry: EntryWriter) -> int:
        data = bytes(entry.to_bytes())
        with self._lock:
            self._data[entry.key] = (data, entry.expires or 0.0)
        return len(data)

    def delete(self, key: Key) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        with self._lock:
            doomed = [
                k for k in self._data
                if (namespace is None or k.namespace == namespace)
                and (function is None or k.function == function)
            ]
            for k in doomed:
                del self._data[k]
        return len(doomed)

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]:
        for key, (data, _) in list(self._data.items()):
            if namespace is None or key.namespace == namespace:
                yield describe_buffer(data, f"memory:{key.hex}")

    def stats(self) -> dict[str, Any]:
        items = list(self._data.values())
        return {"backend": "memory", "entries": len(items), "bytes": sum(len(d) for d, _ in items)}

    def lock(self, key: Key, timeout: float) -> AbstractContextManager[Held]:
        # The decorator already serialises callers within this process, the only place this
        # store is visible from.
        return nullcontext(Held.FREE)
