"""The layer rules hold (import-linter, .importlinter), they fail when broken, and no module
imports itself through others (no import cycles, lazy imports included)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import grimp

from tests.sim_helpers import REPO

ROOTS = ("runtime", "traces", "simulator", "analysis")


def lint_imports(cwd) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})


def test_the_layer_contracts_are_kept():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_forbidden_import_breaks_the_contracts(tmp_path):
    for name in (*ROOTS, ".importlinter"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    scheduler = tmp_path / "runtime" / "engine" / "scheduler.py"
    scheduler.write_text(scheduler.read_text() + "\n\ndef _planted():\n    import torch  # noqa: F401\n"
                         "    from runtime.executor import model_runner  # noqa: F401\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "never import torch" in done.stdout and "BROKEN" in done.stdout
    assert "runtime.engine.scheduler -> runtime.executor.model_runner" in done.stdout


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm over the module graph: every component of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles():
    assert strongly_connected(grimp.build_graph(*ROOTS)) == []
