"""Code-aware keys: an edited function or helper is a miss, in a new process and in a notebook;
moved code, comments and blank lines are not."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from arrowstash import cache
from arrowstash.caching.code import CodeTracker

SCRIPT = """
import sys
from arrowstash import cache
from arrowstash.backends.file import FileBackend

{helpers}

@cache(backend=FileBackend(sys.argv[1]), l1=False)
def compute(x):
    {body}

print(compute(3), compute.cache_info().misses)
"""


def run(tmp_path: Path, body: str, helpers: str = "", prefix: str = "") -> tuple[str, int]:
    """Write the module, run it in a new process; return its result and how many calls missed."""
    script = tmp_path / "job.py"
    script.write_text(prefix + SCRIPT.format(body=body, helpers=helpers))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120, check=True)
    value, misses = done.stdout.split()
    return value, int(misses)


def test_an_edited_body_recomputes_in_a_new_process(tmp_path: Path) -> None:
    assert run(tmp_path, "return x + 1") == ("4", 1)
    assert run(tmp_path, "return x + 1") == ("4", 0)  # same code: a hit
    assert run(tmp_path, "return x * 1000 + 1") == ("3001", 1)  # the example
    assert run(tmp_path, "return x + 1") == ("4", 0)  # the first version's entry is still there


def test_comments_blank_lines_and_moves_are_still_hits(tmp_path: Path) -> None:
    assert run(tmp_path, "return x + 1") == ("4", 1)
    assert run(tmp_path, "# a comment\n    return x + 1  # another") == ("4", 0)
    assert run(tmp_path, "\n\n    return x + 1", prefix="\n\n# moved down\n\n") == ("4", 0)
    assert run(tmp_path, '"""Now documented."""\n    return x + 1') == ("4", 0)


def test_an_edited_helper_recomputes_in_a_new_process(tmp_path: Path) -> None:
    helpers = "def inner(x):\n    return x {op} 1\n\ndef helper(x):\n    return inner(x)\n"
    body = "return helper(x)"
    assert run(tmp_path, body, helpers.format(op="+")) == ("4", 1)
    assert run(tmp_path, body, helpers.format(op="+")) == ("4", 0)
    # two levels down: compute -> helper -> inner
    assert run(tmp_path, body, helpers.format(op="-")) == ("2", 1)


def test_a_helper_in_another_user_module_is_tracked(tmp_path: Path) -> None:
    lib = tmp_path / "mylib.py"
    lib.write_text("def clean(x):\n    return x + 1\n")
    helpers = "import mylib"
    assert run(tmp_path, "return mylib.clean(x)", helpers) == ("4", 1)
    assert run(tmp_path, "return mylib.clean(x)", helpers) == ("4", 0)
    lib.write_text("def clean(x):\n    return x + 2\n")
    assert run(tmp_path, "return mylib.clean(x)", helpers) == ("5", 1)


def test_module_constants_are_tracked(tmp_path: Path) -> None:
    assert run(tmp_path, "return x + SCALE", "SCALE = 1") == ("4", 1)
    assert run(tmp_path, "return x + SCALE", "SCALE = 1") == ("4", 0)
    assert run(tmp_path, "return x + SCALE", "SCALE = 2") == ("5", 1)


def notebook(source: str, namespace: dict[str, Any]) -> None:
    """Run a notebook cell: code in the ``__main__``-like namespace of the session."""
    exec(compile(textwrap.dedent(source), "<cell>", "exec"), namespace)


def test_a_helper_redefined_in_a_later_cell_is_noticed_on_an_l1_hit(
        caplog: pytest.LogCaptureFixture) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "cache": cache}
    notebook("""
        def helper(x):
            return x + 1

        @cache(backend=None)
        def compute(x):
            return helper(x) * 10
    """, namespace)
    compute = namespace["compute"]
    assert compute(1) == compute(1) == 20
    assert compute.cache_info().l1_hits == 1
    with caplog.at_level(logging.INFO, logger="arrowstash.cache"):
        notebook("def helper(x):\n    return x + 2\n", namespace)
        assert compute(1) == 30  # the L1 entry of the old helper is not served
        assert compute(1) == 30
    info = compute.cache_info()
    assert (info.misses, info.code_changes, info.l1_hits) == (2, 1, 2)
    lines = [r for r in caplog.records if "code changed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    # redefined with the same code: a new object, the same fingerprint, still a hit
    notebook("def helper(x):\n    return x + 2\n", namespace)
    assert compute(1) == 30 and compute.cache_info().code_changes == 1


def test_code_ignore_keeps_the_old_entries() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "cache": cache}
    notebook("""
        def helper(x):
            return x + 1

        @cache(backend=None, code="ignore")
        def compute(x):
            return helper(x)
    """, namespace)
    assert namespace["compute"](1) == 2
    notebook("def helper(x):\n    return x + 5\n", namespace)
    assert namespace["compute"](1) == 2  # by request: version= is the only marker
    assert namespace["compute"].cache_info().code_changes == 0
    with pytest.raises(ValueError, match="code must be"):
        cache(code="sometimes")


def fingerprint(func: Any) -> bytes:
    return CodeTracker(func).update()


def compiled(source: str, first_line: int = 1, **scope: Any) -> Any:
    namespace: dict[str, Any] = {"__name__": "nb", **scope}
    exec(compile("\n" * (first_line - 1) + textwrap.dedent(source), "<x>", "exec"), namespace)
    return namespace["f"]


def test_the_fingerprint_covers_code_defaults_closures_and_not_positions() -> None:
    base = fingerprint(compiled("def f(x, n=1):\n    return x + n\n"))
    assert base == fingerprint(compiled("def f(x, n=1):\n    return x + n\n", first_line=40))
    assert base != fingerprint(compiled("def f(x, n=2):\n    return x + n\n"))  # a default
    assert base != fingerprint(compiled("def f(x, n=1):\n    return x - n\n"))  # bytecode
    assert base != fingerprint(compiled("def f(x, n=1):\n    return x + n + 0.5\n"))  # consts
    # nested code objects and closure cells
    outer = "def make(k):\n    def f(x):\n        return [x + k for _ in (1,)]\n    return f\n"
    namespace: dict[str, Any] = {"__name__": "nb"}
    exec(outer, namespace)
    assert fingerprint(namespace["make"](1)) == fingerprint(namespace["make"](1))
    assert fingerprint(namespace["make"](1)) != fingerprint(namespace["make"](2))


def test_cycles_and_classes_reached_through_globals() -> None:
    source = """
        class Scaler:
            factor = 2
            def apply(self, x):
                return ping(x) * self.factor

        def ping(x):
            return pong(x - 1) if x > 0 else 0

        def pong(x):
            return ping(x)

        def f(x):
            return Scaler().apply(x)
    """
    base = fingerprint(compiled(source))  # mutual recursion ends
    assert base == fingerprint(compiled(source))
    assert base != fingerprint(compiled(source.replace("factor = 2", "factor = 3")))
    assert base != fingerprint(compiled(source.replace("x - 1", "x - 2")))


def test_installed_and_standard_library_code_is_not_walked() -> None:
    import json

    tracker = CodeTracker(compiled("def f(x):\n    return json.dumps(pytest.approx(x))\n",
                                   json=json, pytest=pytest))
    tracker.update()
    assert tracker.others == [] and tracker.get(tracker.scope) == 0  # nothing watched


def test_generator_functions_are_refused_when_decorated() -> None:
    with pytest.raises(TypeError, match=r"generator function .*rows"):
        @cache(backend=None)
        def rows(n: int) -> Any:
            yield from range(n)

    with pytest.raises(TypeError, match=r"generator function .*stream"):
        @cache(backend=None)
        async def stream(n: int) -> Any:
            yield n
