"""Runs an operation's steps (see ``operations``) for a sync caller: backend verbs, the
function and waits are called directly, in the caller's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from arrowstash.backends.base import Held
from arrowstash.caching import operations as ops
from arrowstash.caching.pipeline import MISSING, Core
from arrowstash.entry.format import Key
from arrowstash.errors import BackendError

#: The stampede locks one run holds, by key.
Locks = dict[Key, AbstractContextManager[Held]]
Handler = Callable[[Core, ops.Step, Locks], Any]


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
    if core.l1 is not None:
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
    locks: Locks = {}
    result: Any = None
    error: BaseException | None = None
    send = op.send
    steps: dict[type, Handler] = _STEPS
    while True:
        try:
            step = send(result) if error is None else op.throw(error)
        except StopIteration as done:
            return done.value
        result = error = None
        try:
            result = steps.get(step[0], _unknown)(core, step, locks)
        except BaseException as exc:  # the function's own, or a backend's: the op decides
            error = exc


def _get(core: Core, step: ops.Step, locks: Locks) -> Any:
    return core.backend.get(step[1])  # type: ignore[union-attr]  # yielded with a backend


def _aside(core: Core, step: ops.Step, locks: Locks) -> Any:
    _, func, args = step
    return func(*args)


def _call(core: Core, step: ops.Step, locks: Locks) -> Any:
    _, args, kwargs = step
    return core.func(*args, **kwargs)


def _put(core: Core, step: ops.Step, locks: Locks) -> Any:
    _, key, prepared = step
    return core.backend.set(prepared.writer(key))  # type: ignore[union-attr]


def _join(core: Core, step: ops.Step, locks: Locks) -> bool:
    return core.flights.enter(step[1])


def _leave(core: Core, step: ops.Step, locks: Locks) -> None:
    core.flights.leave(step[1])


def _take(core: Core, step: ops.Step, locks: Locks) -> Held:
    return _lock(core, step[1], locks)


def _unlock(core: Core, step: ops.Step, locks: Locks) -> None:
    held = locks.pop(step[1], None)
    if held is not None:
        held.__exit__(None, None, None)


def _spawn(core: Core, step: ops.Step, locks: Locks) -> None:
    threading.Thread(target=run, args=(core, step[1]),
                     name=f"arrowstash refresh of {core.name}", daemon=True).start()


def _unknown(core: Core, step: ops.Step, locks: Locks) -> Any:
    raise TypeError(f"unknown step {step!r}")


#: What each kind of step does, found by one dict lookup per step.
_STEPS: dict[type, Handler] = {
    ops.Get: _get, ops.Aside: _aside, ops.Call: _call, ops.Put: _put, ops.Join: _join,
    ops.Leave: _leave, ops.Lock: _take, ops.Unlock: _unlock, ops.Spawn: _spawn,
}


def _lock(core: Core, key: Key, locks: Locks) -> Held:
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
