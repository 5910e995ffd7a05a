"""The in-process first layer: a thread-safe LRU bounded by entries and bytes, honouring TTL."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple


class L1Item(NamedTuple):
    expires: float  # 0.0 means never
    size: int
    value: Any  # the value itself when immutable, else None
    load: Callable[[], Any] | None  # else decodes a fresh copy from the encoded form


class L1:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("l1_max_entries and l1_max_bytes must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, L1Item] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, digest: bytes) -> L1Item | None:
        with self._lock:
            item = self._items.get(digest)
            if item is None:
                return None
            if item.expires and item.expires <= time.time():
                self._drop(digest)
                return None
            self._items.move_to_end(digest)
            return item

    def put(self, digest: bytes, item: L1Item) -> None:
        if item.size > self.max_bytes:
            return
        with self._lock:
            if digest in self._items:
                self._drop(digest)
            self._items[digest] = item
            self._bytes += item.size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def pop(self, digest: bytes) -> None:
        with self._lock:
            if digest in self._items:
                self._drop(digest)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def _drop(self, digest: bytes) -> None:
        self._bytes -= self._items.pop(digest).size
