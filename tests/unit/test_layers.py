"""The house keeps its shape: layers that import only downward, no cycles, a short top level,
and a picture of the layers in docs/developing.md that matches the code.

import-linter checks the contracts in pyproject.toml (``make test`` runs ``lint-imports``
before pytest; this test runs it too, so a broken contract fails in pytest's summary).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.lesson00


def _graph():  # type: ignore[no-untyped-def]
    grimp = pytest.importorskip("grimp")
    return grimp.build_graph("labkit", include_external_packages=False)


def test_no_module_imports_itself_back() -> None:
    """No import cycle between modules (a strongly connected component of the import graph
    larger than one module names every module in it)."""
    graph = _graph()
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm, iterative enough for 250 modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    for m in sorted(edges):
        if m not in index:
            visit(m)
    assert cycles == [], f"import cycles: {cycles}"


def test_the_top_level_holds_at_most_twelve_modules() -> None:
    """A newcomer opening labkit/ sees the rooms, not a heap of modules."""
    top = sorted(p.name for p in (ROOT / "labkit").glob("*.py"))
    assert len(top) <= 12, top


def test_the_import_contracts_hold() -> None:
    """pyproject.toml's layers and forbidden imports (import-linter)."""
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    out = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_the_picture_of_the_layers_is_current() -> None:
    """docs/developing.md opens with the layers drawn from the import graph (`make layers`)."""
    pytest.importorskip("grimp")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "layers.py"), "--check"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
