"""A backend that could not be made, standing in for it so that decorating never fails on the
environment: each verb raises the error of the attempt, which the pipeline logs once and
answers by running uncached (or raises with ``strict=True``), like any other backend failure."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, NoReturn

from arrowstash.backends.base import Capabilities, Held, Stored
from arrowstash.entry.format import EntryWriter, Key
from arrowstash.entry.listing import EntryInfo
from arrowstash.errors import BackendError


class UnavailableBackend:
    """The backend ``url`` names, which could not be made: ``error`` says why."""

    def __init__(self, url: str, error: BackendError, capabilities: Capabilities,
                 encrypt: bool = False) -> None:
        self.url = url
        self.error = error
        self.capabilities = capabilities
        self.encrypt = encrypt  # as the URL asked: the function still needs its key

    def __repr__(self) -> str:
        return f"UnavailableBackend({self.url!r}: {self.error})"

    def _fail(self) -> NoReturn:
        raise BackendError(f"backend {self.url} is unavailable: {self.error}")

    def get(self, key: Key) -> Stored | None:
        self._fail()

    def set(self, entry: EntryWriter) -> int:
        self._fail()

    def delete(self, key: Key) -> bool:
        self._fail()

    def clear(self, namespace: str | None = None, function: str | None = None) -> int:
        self._fail()

    def entries(self, namespace: str | None = None) -> Iterator[EntryInfo]:
        self._fail()

    def stats(self) -> dict[str, Any]:
        self._fail()

    def lock(self, key: Key, timeout: float) -> AbstractContextManager[Held]:
        self._fail()
