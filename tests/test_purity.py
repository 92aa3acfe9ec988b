"""The pure layers (the log's vocabulary, the engine core, the simulator, the analysis) read no
clock and draw no unseeded random number: time and seeds come in as arguments, so the same inputs
give the same log. (That they never import torch is an import-linter contract: .importlinter.)"""

from __future__ import annotations

import ast

import pytest

from tests.sim_helpers import REPO

PURE_PACKAGES = ["traces", "runtime/engine", "simulator", "analysis"]
PURE = sorted(str(p.relative_to(REPO)) for pkg in PURE_PACKAGES for p in (REPO / pkg).rglob("*.py"))
BANNED_MODULES = {"time", "random", "datetime", "secrets", "uuid"}
BANNED_CALLS = {"now", "utcnow", "today", "monotonic", "perf_counter", "process_time", "time_ns", "urandom"}
# modules allowed a banned import, and why
ALLOWED = {
    # Azure timestamps are parsed (datetime.fromisoformat), never read from the clock
    ("traces/importers/azure.py", "datetime"),
}


def banned_uses(rel: str) -> list[str]:
    tree = ast.parse((REPO / rel).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for top in {n.split(".")[0] for n in names} & BANNED_MODULES:
                if (rel, top) not in ALLOWED:
                    found.append(f"{rel}:{node.lineno}: imports {top}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr in BANNED_CALLS:
                found.append(f"{rel}:{node.lineno}: reads a clock ({attr})")
            if attr in ("default_rng", "Generator", "RandomState") and not node.args and not node.keywords:
                found.append(f"{rel}:{node.lineno}: {attr}() without a seed")
    return found


def test_the_pure_layers_are_all_checked():
    assert len(PURE) > 30 and "runtime/engine/scheduler.py" in PURE and "traces/log.py" in PURE


@pytest.mark.parametrize("rel", PURE)
def test_reads_no_clock_and_draws_no_unseeded_numbers(rel):
    assert banned_uses(rel) == []


def test_the_check_catches_a_clock(tmp_path, monkeypatch):
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nimport numpy as np\nx = time.monotonic()\nrng = np.random.default_rng()\n")
    monkeypatch.setattr("tests.test_purity.REPO", tmp_path)
    assert len(banned_uses("bad.py")) == 3
