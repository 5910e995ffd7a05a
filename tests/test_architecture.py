"""The layers hold: no import circle among the package's modules (imports inside functions
included), no import from a lower layer up, and ``import arrowstash`` stays light."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import arrowstash

PACKAGE = Path(arrowstash.__file__).parent
#: Lower layers first; a module may import its own package and lower layers only.
LAYERS = {
    "errors": 0, "config": 0,
    "entry": 1, "avro": 1,
    "backends": 2, "serializers": 2,
    "caching": 3,
    "metrics": 4,
    "cli": 5,
    "__init__": 6, "__main__": 6,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target != "arrowstash":
                found.add(target)
    return found


def _layer(module: str) -> tuple[str, int]:
    top = module.split(".")[1] if "." in module else "__init__"
    return top, LAYERS[top]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_top_level_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert {_layer(m)[0] for m in graph} <= LAYERS.keys()


def test_no_import_runs_back_up(graph: dict[str, set[str]]) -> None:
    upward = []
    for module, targets in graph.items():
        top, rank = _layer(module)
        for target in targets:
            target_top, target_rank = _layer(target)
            if target_top != top and target_rank >= rank and target_top != "__init__":
                upward.append(f"{module} -> {target}")
    assert not upward, upward


def test_no_import_circle(graph: dict[str, set[str]]) -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    for node in graph:
        if node not in index:
            visit(node)
    assert not circles, circles


def test_import_arrowstash_stays_light() -> None:
    heavy = ("asyncio", "redis", "pymemcache", "cryptography", "numpy", "pandas", "polars",
             "prometheus_client", "obstore", "dask", "rich")
    code = (f"import sys, arrowstash; print(' '.join(sorted(m for m in sys.modules "
            f"if m.split('.')[0] in {heavy!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_documented_submodules_are_attributes_of_a_plain_import() -> None:
    """The docs write ``arrowstash.metrics.enable()`` after ``import arrowstash``."""
    code = ("import sys, arrowstash; loaded = 'arrowstash.metrics' in sys.modules; "
            "print(loaded, callable(arrowstash.metrics.enable), arrowstash.config.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "arrowstash.config"]


@pytest.mark.parametrize("limit", [600])
def test_no_module_past_the_limit(limit: int) -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > limit}
    assert not long, long


def test_functions_are_short_and_take_few_parameters() -> None:
    """No function over 60 lines or with more than 8 parameters, but the public cache()."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            count = len([a for a in params if a.arg not in ("self", "cls")])
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if (lines > 60 or count > 8) and node.name != "cache":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert not found, found


def test_only_config_reads_the_environment() -> None:
    readers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if p.name != "config.py" and ("os.environ" in (text := p.read_text())
                                                   or "getenv(" in text))
    assert readers == []


def test_every_variable_config_reads_is_in_the_docs_table() -> None:
    source = (PACKAGE / "config.py").read_text()
    read = set(re.findall(r'environ(?:\.get\(|\[)"([A-Z_]+)"', source))
    table = (PACKAGE.parents[1] / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)`", table, flags=re.M))
    assert read and read == documented


def test_tests_mirror_the_package_tree() -> None:
    """A test lives in the folder of the package it tests (or contract/ for the suites every
    backend and serializer passes), so the tree of tests reads like the tree of the code."""
    tests = Path(__file__).parent
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    allowed = packages | {"contract", "stress"}
    # the root keeps the tests of the package as a whole
    root_files = {"test_architecture.py", "test_docs.py", "test_public_api.py"}
    misplaced = [str(p.relative_to(tests)) for p in tests.rglob("test_*.py")
                 if (p.parent == tests and p.name not in root_files)
                 or (p.parent != tests and p.relative_to(tests).parts[0] not in allowed)]
    assert not misplaced, misplaced
