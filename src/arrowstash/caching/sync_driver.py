"""Runs an operation's steps (see ``operations``) for a sync caller: backend verbs, the
function and waits are called directly, in the caller's thread."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from arrowstash.backends.base import Held
from arrowstash.caching import operations as ops
from arrowstash.caching.pipeline import MISSING, Core
from arrowstash.entry.format import Key
from arrowstash.errors import BackendError


def call(core: Core, digest: bytes, args: tuple[Any, ...], kwargs: dict[str, Any],
         started: float) -> Any:
    """``ops.call`` with its first look taken here, stage by stage: a hit (the common call)
    then costs no generator, and the operation runs only for what is left."""
    looked = _look(core, digest)
    if ops.settled(core, looked, started):
        return looked[0]
    return run(core, ops.call(core, digest, args, kwargs, started, looked))


def _look(core: Core, digest: bytes) -> ops.Looked:
    """The first look of ``ops.call`` (L1, then ``ops.read``'s one Get), run directly: the same
    stages of ``Core``, in the same order, with a large entry decoded inline as Aside is."""
    value, expires = core.l1_entry(digest)
    if value is not MISSING:
        return value, expires, True
    backend = core.backend
    if backend is None:
        return MISSING, 0.0, False
    key = core.key(digest)
    try:
        stored = backend.get(key)
    except BackendError as exc:
        value, expires = core.read_failed(key, exc, True)
    else:
        value, expires = core.load_entry(key, stored, True)
    return value, expires, False


def run(core: Core, op: ops.Op) -> Any:
    """Drive ``op`` to its end and return its value; an exception of a step is thrown into the
    operation (which releases what it holds) and comes out here unless it handles it."""
    locks: dict[Key, AbstractContextManager[Held]] = {}
    result: Any = None
    error: BaseException | None = None
    send = op.send
    while True:
        try:
            step = send(result) if error is None else op.throw(error)
        except StopIteration as done:
            return done.value
        result = error = None
        try:
            # a hit's one step without the dispatch call (Get is only yielded with a backend)
            if type(step) is ops.Get:
                result = core.backend.get(step.key)  # type: ignore[union-attr]
            else:
                result = _run_step(core, step, locks)
        except BaseException as exc:  # the function's own, or a backend's: the op decides
            error = exc


def _run_step(core: Core, step: Any, locks: dict[Key, AbstractContextManager[Held]]) -> Any:
    kind = type(step)
    if kind is ops.Aside:
        return step.func(*step.args)
    if kind is ops.Call:
        return core.func(*step.args, **step.kwargs)
    if kind is ops.Put:
        assert core.backend is not None
        return core.backend.set(step.prepared.writer(step.key))
    if kind is ops.Join:
        return core.flights.enter(step.digest)
    if kind is ops.Leave:
        core.flights.leave(step.digest)
        return None
    if kind is ops.Lock:
        return _lock(core, step.key, locks)
    if kind is ops.Unlock:
        held = locks.pop(step.key, None)
        if held is not None:
            held.__exit__(None, None, None)
        return None
    if kind is ops.Spawn:
        threading.Thread(target=run, args=(core, step.operation),
                         name=f"arrowstash refresh of {core.name}", daemon=True).start()
        return None
    raise TypeError(f"unknown step {step!r}")


def _lock(core: Core, key: Key, locks: dict[Key, AbstractContextManager[Held]]) -> Held:
    """Take the backend's stampede lock, if it has one and ``lock`` is on. A lock the backend
    cannot take is a logged failure: the caller computes without it (Held.TIMEOUT)."""
    if core.backend is None or not core.lock:
        return Held.FREE
    manager = core.backend.lock(key, core.lock_timeout)
    try:
        held = manager.__enter__()
    except BackendError as exc:
        core.lock_failed(key, exc)
        return Held.TIMEOUT
    locks[key] = manager
    core.lock_taken(key, held)
    return held
