"""Runs an operation's steps (see ``operations``) for an async caller: a backend that declares
async I/O is awaited directly; any other backend's verbs, and long encoding or decoding, run in
a worker thread, so the event loop never blocks."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from arrowstash.backends.base import AsyncBackend, Held
from arrowstash.caching import operations as ops
from arrowstash.caching.pipeline import Core
from arrowstash.entry.format import Key
from arrowstash.errors import BackendError


async def run(core: Core, op: ops.Op) -> Any:
    """``sync_driver.run`` for coroutines: the same operation, each step awaited."""
    state = _State()
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = op.send(result) if error is None else op.throw(error)
        except StopIteration as done:
            return done.value
        result = error = None
        try:
            result = await _run_step(core, step, state)
        except BaseException as exc:  # the function's own, a backend's, or a cancellation
            error = exc


class _State:
    """What one run holds between steps: its locks and the futures of its flights."""

    __slots__ = ("flights", "locks")

    def __init__(self) -> None:
        self.locks: dict[Key, Any] = {}
        self.flights: dict[bytes, asyncio.Future[None]] = {}


async def _run_step(core: Core, step: ops.Step, state: _State) -> Any:
    kind = step[0]
    backend = core.backend
    native = backend is not None and backend.capabilities.async_io
    if kind is ops.Get:
        assert backend is not None
        if native:
            return await cast(AsyncBackend, backend).aget(step[1])
        return await asyncio.to_thread(backend.get, step[1])
    if kind is ops.Aside:
        _, func, args = step
        return await asyncio.to_thread(func, *args)
    if kind is ops.Call:
        _, args, kwargs = step
        return await core.func(*args, **kwargs)
    if kind is ops.Put:
        assert backend is not None
        _, key, prepared = step
        entry = prepared.writer(key)
        if native:
            return await cast(AsyncBackend, backend).aset(entry)
        return await asyncio.to_thread(backend.set, entry)
    if kind is ops.Join:
        return await _join(core, step[1], state)
    if kind is ops.Leave:
        digest = step[1]
        loop_flights = core.loop_flights[asyncio.get_running_loop()]
        del loop_flights[digest]
        state.flights.pop(digest).set_result(None)
        return None
    if kind is ops.Lock:
        return await _lock(core, step[1], state)
    if kind is ops.Unlock:
        return await _unlock(core, step[1], state)
    if kind is ops.Spawn:
        task = asyncio.get_running_loop().create_task(run(core, step[1]))
        core.background.add(task)
        task.add_done_callback(core.background.discard)
        return None
    raise TypeError(f"unknown step {step!r}")


async def _join(core: Core, digest: bytes, state: _State) -> bool:
    """Wait while another task of this loop computes ``digest``, then become its computer."""
    loop = asyncio.get_running_loop()
    flights = core.loop_flights.get(loop)
    if flights is None:
        flights = core.loop_flights.setdefault(loop, {})
    waited = False
    while (pending := flights.get(digest)) is not None:
        waited = True
        await asyncio.shield(pending)
    done: asyncio.Future[None] = loop.create_future()
    flights[digest] = state.flights[digest] = done
    return waited


async def _lock(core: Core, key: Key, state: _State) -> Held:
    backend = core.backend
    if backend is None or not core.lock:
        return Held.FREE
    manager: Any
    try:
        if backend.capabilities.async_io:
            manager = cast(AsyncBackend, backend).alock(key, core.lock_timeout)
            held: Held = await manager.__aenter__()
        else:
            manager = backend.lock(key, core.lock_timeout)
            held = await asyncio.to_thread(manager.__enter__)
    except BackendError as exc:
        core.lock_failed(key, exc)
        return Held.TIMEOUT
    state.locks[key] = manager
    core.lock_taken(key, held)
    return held


async def _unlock(core: Core, key: Key, state: _State) -> None:
    manager = state.locks.pop(key, None)
    if manager is None:
        return
    assert core.backend is not None
    if core.backend.capabilities.async_io:
        await manager.__aexit__(None, None, None)
    else:
        await asyncio.to_thread(manager.__exit__, None, None, None)
