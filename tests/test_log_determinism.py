"""Logs are byte-identical across processes: the same seeded workload, run in two Python processes
with different ``PYTHONHASHSEED`` values, through the engine core (seeded executor) and through the
simulator (linear cost model), writes the same bytes. In-process repeats (tests/test_core.py,
tests/test_sim.py) can't catch an iteration over a set of strings or anything else that depends on
the process's hash seed; this does.

Run as a script (``python -m tests.test_log_determinism OUT_DIR``) it writes ``core.jsonl`` and
``sim.jsonl`` to ``OUT_DIR``: that is what each subprocess does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HASH_SEEDS = ("0", "12345")


def write_core_log(path: Path) -> None:
    """EngineCore + seeded executor, with what a log can carry: stop strings and ids, priorities,
    eos, prefix hits, chunked prefill, preemption, an abort."""
    from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from runtime.engine.core import EngineCore
    from tests.helpers import SeededTokenExecutor
    from traces.events import make_header
    from traces.log import LogWriter
    from traces.params import SamplingParams

    config = EngineConfig(
        cache=CacheConfig(block_size=4, num_blocks=18, hash_salt="tenant-é"),
        scheduler=SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=6, policy="priority", max_model_len=96),
        model_identity="determinism-test@1", seed=7)
    executor = SeededTokenExecutor(seed=11, vocab=60, eos_id=0, eos_every=13)
    with LogWriter(path) as log:
        log(make_header(config, clock="sim", extra={"tags": {"b": 1, "a": 2}, "names": ["x", "y"]}))
        core = EngineCore(config, eos_token_id=0, sink=log)
        now = 0.0
        for i in range(24):
            prefix = [100 + 7 * (i % 3) + j for j in range(8)] if i % 4 else []
            params = SamplingParams(max_tokens=3 + i % 11, ignore_eos=i % 5 == 0,
                                    stop=("ab", "ç") if i % 6 == 1 else (), stop_token_ids=(5, 9) if i % 7 == 2 else (),
                                    temperature=0.5 * (i % 3), seed=i)
            core.add_request(prefix + [1 + (13 * i + j) % 59 for j in range(2 + (5 * i) % 17)], params,
                             now=now, priority=i % 3)
            if i % 3 == 2:
                out = core.step(now, executor)
                now += out.result.duration if out.result else 0.0
        core.abort(5, now)
        while core.has_unfinished():
            out = core.step(now, executor)
            now += out.result.duration


def write_sim_log(path: Path) -> None:
    """The simulator on a bursty workload with a shared prefix, a tight pool (preemption) and priorities."""
    from simulator.cost.linear_model import LinearCostModel
    from simulator.sim import simulate
    from tests.sim_helpers import mixed_workload, small_config
    from traces.log import LogWriter

    cost = LinearCostModel({"const": 0.003, "prefill_tokens": 2e-5, "prefill_attention": 1e-9,
                            "decode_seqs": 1e-4, "decode_context": 1e-7, "seqs": 5e-5})
    with LogWriter(path) as log:
        simulate(mixed_workload(60, seed=3), small_config(num_blocks=40, budget=128, policy="priority"), cost,
                 sink=log)


def test_logs_are_byte_identical_across_processes_and_hash_seeds(tmp_path):
    repo = Path(__file__).resolve().parent.parent
    outs = []
    for seed in HASH_SEEDS:
        out = tmp_path / f"hashseed-{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-m", "tests.test_log_determinism", str(out)], cwd=repo, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    for name in ("core.jsonl", "sim.jsonl"):
        a, b = (o / name for o in outs)
        assert a.read_bytes() == b.read_bytes(), f"{name} differs between PYTHONHASHSEED={HASH_SEEDS}"
    # the logs exercise what could differ: prefix hits, evictions, preemptions, stops of each kind
    core, sim = (outs[0] / n for n in ("core.jsonl", "sim.jsonl"))
    text = core.read_text() + sim.read_text()
    for marker in ('"Preempted"', '["hit",', '"reason":"stop"', '"reason":"length"', '"Aborted"'):
        assert marker in text, marker
    from traces.log import fold, read_log

    assert fold(read_log(core)).evictions > 0 and fold(read_log(sim)).evictions > 0  # an eviction is an alloc's
    assert core.stat().st_size > 10_000 and sim.stat().st_size > 10_000


if __name__ == "__main__":
    # PYTHONHASHSEED is read at interpreter start: check the subprocess really got it
    assert os.environ.get("PYTHONHASHSEED") in HASH_SEEDS, "run with PYTHONHASHSEED set (see the test)"
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    write_core_log(target / "core.jsonl")
    write_sim_log(target / "sim.jsonl")
