"""The simulator side stays pure: no torch, no clock, no unseeded randomness."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.sim_helpers import REPO

PURE = ["simulator/sim.py", "simulator/cost_model.py", "simulator/nnls.py", "simulator/roofline.py",
        "simulator/policy.py", "simulator/replay.py", "simulator/execute.py", "traces/workload.py",
        "traces/importers.py", "traces/generators.py", "analysis/frames.py", "analysis/metrics.py"]


def test_simulator_modules_do_not_import_torch():
    mods = [p.removesuffix(".py").replace("/", ".") for p in PURE]
    code = f"import sys\nfor m in {mods!r}: __import__(m)\nassert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_simulator_modules_read_no_clock_and_draw_no_unseeded_numbers():
    banned_modules = {"time", "random"}
    banned_calls = {"now", "utcnow", "today", "monotonic", "perf_counter", "default_rng"}
    for rel in PURE:
        tree = ast.parse((REPO / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not banned_modules & {n.split(".")[0] for n in names}, f"{rel}: imports {names}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in banned_calls:
                if node.func.attr == "default_rng":
                    assert node.args, f"{rel}:{node.lineno}: default_rng() without a seed"
                else:
                    raise AssertionError(f"{rel}:{node.lineno}: reads a clock ({node.func.attr})")
