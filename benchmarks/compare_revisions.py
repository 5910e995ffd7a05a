"""Instructions per cached call: this checkout against another revision of arrowstash, side by
side, counted by valgrind (callgrind), so the figures do not move with the machine's load.

Run it from the repository root (needs valgrind)::

    git worktree add /tmp/arrowstash-base 4df043e   # the revision to compare with
    python benchmarks/compare_revisions.py /tmp/arrowstash-base [--quick]

Each workload runs in a fresh interpreter twice, with N and 2N calls; the difference divided by
N is the cost of one call with start-up and warm-up taken out. Both trees are imported from
their ``src`` folders with the same interpreter and packages; the compiled Avro extension is not
used by these workloads. A ratio above 1 means this checkout runs more instructions per call.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"

#: name -> (set-up code, the call repeated N times, N). ``tmp`` is a fresh folder.
WORKLOADS = {
    "L1 hit (backend=None)": (
        "f = cache(backend=None)(lambda x: {'id': x, 'tags': ['a', 'b']}); f(7)",
        "f(7)", 4000),
    # the function reads a helper of its module: the fast path tests that it was not rebound
    # (code-aware keys, which the first release did not have)
    "L1 hit, reading a module helper": (
        "def tags(): return ['a', 'b']\n"
        "f = cache(backend=None)(lambda x: {'id': x, 'tags': tags()}); f(7)",
        "f(7)", 4000),
    "File hit (l1=False)": (
        "f = cache(backend=FileBackend(tmp), l1=False)(lambda x: {'id': x}); f(7)",
        "f(7)", 400),
    "File miss + store (l1=False)": (
        "f = cache(backend=FileBackend(tmp), l1=False)(lambda x: {'id': x})\n"
        "n = iter(range(10**9))",
        "f(next(n))", 200),
    "Memory hit, 1 MB array (l1=False)": (
        "import numpy as np; a = np.arange(131072.0)\n"
        "f = cache(backend=MemoryBackend(), l1=False)(lambda x: a + x); f(1)",
        "f(1)", 400),
}

PROGRAM = """
import sys, tempfile
sys.path.insert(0, {src!r})
from arrowstash import cache, FileBackend, MemoryBackend
tmp = tempfile.mkdtemp()
{setup}
for _ in range({n}):
    {call}
"""


def instructions(src: Path, setup: str, call: str, n: int) -> int:
    """Instructions of one interpreter running ``setup`` then ``call`` ``n`` times."""
    with tempfile.TemporaryDirectory() as out:
        script = Path(out) / "w.py"
        script.write_text(PROGRAM.format(src=str(src), setup=setup, call=call, n=n))
        log = Path(out) / "cg.out"
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={log}",
                        sys.executable, str(script)], check=True, capture_output=True, env=env)
        found = re.search(r"^summary:\s+(\d+)", log.read_text(), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no summary in {log}")
        return int(found.group(1))


def per_call(src: Path, setup: str, call: str, n: int) -> float:
    return (instructions(src, setup, call, 2 * n) - instructions(src, setup, call, n)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="a checkout of the revision to compare with")
    parser.add_argument("--quick", action="store_true", help="a quarter of the calls")
    args = parser.parse_args()
    base = args.base.resolve() / "src"
    print("| workload | base instr/call | this instr/call | this / base |")
    print("|---|---:|---:|---:|")
    for name, (setup, call, n) in WORKLOADS.items():
        n = max(n // 4, 20) if args.quick else n
        old = per_call(base, setup, call, n)
        new = per_call(HERE, setup, call, n)
        print(f"| {name} | {old:,.0f} | {new:,.0f} | {new / old:.2f}x |")


if __name__ == "__main__":
    main()
