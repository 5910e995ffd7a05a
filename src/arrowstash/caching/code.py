"""Fingerprints of the code behind a cached function, so that editing it is a miss.

The fingerprint covers the function's compiled code (bytecode, constants, names, nested code;
not line numbers, comments or the file it sits in), its defaults, its closure cells, and, read
through its globals, transitively, the functions, classes and plain constants of the user's own
modules (not the standard library, not installed packages). A :class:`CodeTracker` remembers
what it read so that a cheap comparison tells, on every call, whether a global it depends on
was rebound (a notebook cell redefining a helper).
"""

from __future__ import annotations

import functools
import operator
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator
from typing import Any

import xxhash

#: How many functions deep the walk through globals goes.
MAX_DEPTH = 8
_PLAIN = (int, float, str, bytes, bool, type(None), complex)


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    """Folders of the standard library and installed packages: code there is not the user's."""
    paths = sysconfig.get_paths()
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    roots = {paths[name] for name in names if name in paths}
    roots.update(p for p in sys.path if "site-packages" in p or "dist-packages" in p)
    return tuple(sorted(roots))


def _users(module_name: str | None) -> bool:
    """Whether ``module_name`` is the user's code (a script, notebook or project module)."""
    if not module_name:
        return False
    if module_name == "__main__":  # a script or a notebook
        return True
    top = module_name.partition(".")[0]
    if top == "arrowstash" or top in sys.stdlib_module_names or top == "builtins":
        return False
    module = sys.modules.get(module_name)
    if module is None:  # code run by exec() in a namespace of its own
        return True
    file = getattr(module, "__file__", None)
    if file is None:
        return not hasattr(module, "__path__")
    return not file.startswith(_installed_roots())


def _plain(value: Any) -> bool:
    """Constants whose value is part of the fingerprint (numbers, strings, tuples of them)."""
    if type(value) in _PLAIN:
        return True
    return type(value) in (tuple, frozenset) and len(value) <= 64 and all(map(_plain, value))


class _Walk:
    """One computation of a fingerprint: the hasher, what was seen, and the globals read."""

    def __init__(self) -> None:
        self.h = xxhash.xxh3_128()
        self.seen: set[int] = set()
        #: (globals dict, name, value) of every global the fingerprint read
        self.read: list[tuple[dict[str, Any], str, Any]] = []

    def feed(self, *parts: bytes) -> None:
        for part in parts:
            self.h.update(len(part).to_bytes(8, "little"))
            self.h.update(part)

    def function(self, func: Any, depth: int) -> None:
        if id(func) in self.seen:
            self.feed(b"again", func.__qualname__.encode())  # a cycle: named, not walked again
            return
        self.seen.add(id(func))
        code = func.__code__
        self.feed(b"fn", func.__qualname__.encode())
        # the docstring (or the None standing in for it) is text, not code
        self.code(code, skip_doc=code.co_name != "<lambda>" and code.co_consts[:1] == (
            func.__doc__,))
        self.value(func.__defaults__)
        self.value(func.__kwdefaults__)
        for cell in func.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell (a name not yet bound)
                self.feed(b"empty")
                continue
            self.global_value(contents, depth)
        if depth < MAX_DEPTH:
            self.globals_of(code, func.__globals__, depth + 1)

    def code(self, code: types.CodeType, skip_doc: bool = False) -> None:
        self.feed(b"co", code.co_code, code.co_exceptiontable if hasattr(code, "co_exceptiontable")
                  else b"", repr((code.co_argcount, code.co_posonlyargcount,
                                  code.co_kwonlyargcount, code.co_flags, code.co_names,
                                  code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
        consts = code.co_consts[1:] if skip_doc and code.co_consts else code.co_consts
        for const in consts:
            if isinstance(const, types.CodeType):
                self.code(const)
            else:
                self.value(const)

    def value(self, value: Any) -> None:
        """Constants and defaults, by the key rules where they apply, else by type."""
        from arrowstash.caching.keys import digest_of

        try:
            self.feed(b"v", digest_of(value))
        except TypeError:
            self.feed(b"t", f"{type(value).__module__}.{type(value).__qualname__}".encode())

    def global_value(self, value: Any, depth: int) -> None:
        if isinstance(value, types.FunctionType) and _users(value.__module__):
            self.function(value, depth)
        elif isinstance(value, type) and _users(value.__module__):
            self.cls(value, depth)
        elif isinstance(value, functools.partial):
            self.global_value(value.func, depth)
            self.value((value.args, value.keywords))
        elif _plain(value):
            self.value(value)
        elif hasattr(value, "__wrapped__") and depth < MAX_DEPTH:  # e.g. another @cache
            self.global_value(value.__wrapped__, depth + 1)
        else:  # modules, objects of installed packages: by name only
            self.feed(b"o", f"{type(value).__module__}.{type(value).__qualname__}".encode())

    def cls(self, cls: type, depth: int) -> None:
        if id(cls) in self.seen:
            self.feed(b"again", cls.__qualname__.encode())
            return
        self.seen.add(id(cls))
        self.feed(b"cls", cls.__qualname__.encode(),
                  repr([b.__qualname__ for b in cls.__mro__]).encode())
        for name, member in sorted(vars(cls).items()):
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType):
                self.feed(b"m", name.encode())
                self.function(member, depth)
            elif _plain(member) and not name.startswith("__"):
                self.feed(b"a", name.encode())
                self.value(member)

    def globals_of(self, code: types.CodeType, scope: dict[str, Any], depth: int) -> None:
        for name in sorted(set(_names(code))):
            if name not in scope:
                continue  # a builtin, or not bound (yet)
            value = scope[name]
            if isinstance(value, types.ModuleType):
                if _users(value.__name__):  # ``helpers.clean(...)``: the names read from it
                    for attr in sorted(set(_names(code))):
                        if attr in vars(value) and _tracked(vars(value)[attr]):
                            self.read.append((vars(value), attr, vars(value)[attr]))
                            self.feed(b"g", name.encode(), attr.encode())
                            self.global_value(vars(value)[attr], depth)
                continue
            if _tracked(value):
                self.read.append((scope, name, value))
            self.feed(b"g", name.encode())
            self.global_value(value, depth)


def _tracked(value: Any) -> bool:
    """Globals whose rebinding can change the fingerprint, so the trackers watch them."""
    return isinstance(value, (types.FunctionType, type, functools.partial)) or _plain(value) \
        or hasattr(value, "__wrapped__")


def _names(code: types.CodeType) -> Iterator[str]:
    """Global and attribute names a code object and the code nested in it read."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


class CodeTracker:
    """The fingerprint of one function's code, and a cheap test of whether it may have changed.

    ``get(scope) != seen`` is the fast path's test: one C call reading the globals of the
    function's own module that the fingerprint depends on, compared with what they were.
    :meth:`changed` also looks at the code object and at globals of other modules.
    """

    __slots__ = ("fingerprint", "func", "get", "others", "scope", "seen", "source")

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func: Any = func
        self.fingerprint: bytes | None = None  # computed at the first call: helpers defined
        self.source: Any = None  # below the function exist by then
        self.scope: Any = ()
        self.get: Callable[[Any], Any] = len
        self.seen: Any = -1  # len(()) != -1: the first test says "changed"
        self.others: list[tuple[dict[str, Any], str, Any]] = []

    def changed(self) -> bool:
        """Whether anything the fingerprint read was rebound since it was computed."""
        try:
            if self.get(self.scope) != self.seen:
                return True
        except (KeyError, ValueError):  # a name deleted
            return True
        if getattr(self.func, "__code__", None) is not self.source:
            return True
        return bool(self.others) and any(s.get(n, _GONE) is not v for s, n, v in self.others)

    def update(self) -> bytes:
        """Recompute the fingerprint and what the fast test reads; return the fingerprint."""
        func = self.func
        walk = _Walk()
        while hasattr(func, "__wrapped__") and not hasattr(func, "__code__"):
            func = func.__wrapped__
        if isinstance(func, types.FunctionType):
            walk.function(func, 0)
        else:  # a callable object: its class
            walk.global_value(type(func), 0)
        own = getattr(func, "__globals__", None)
        names = tuple(dict.fromkeys(name for scope, name, _ in walk.read if scope is own))
        self.others = [read for read in walk.read if read[0] is not own]
        if names:
            self.scope, self.get = own, operator.itemgetter(*names)
        else:
            self.scope, self.get = (), len
        self.seen = self.get(self.scope)
        self.source = getattr(self.func, "__code__", None)
        self.fingerprint = walk.h.digest()
        return self.fingerprint


_GONE = object()
