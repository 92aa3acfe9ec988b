"""``minivllm bench core``: µs per step of scheduler + block manager + commit (no model).

The executor returns one fixed non-eos token per sampling span at zero cost, so the figure is the
CPU price of one engine step that a GPU step must hide.
"""

from __future__ import annotations

import gc
import io
import time
from dataclasses import asdict, dataclass

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from traces.log import LogWriter
from traces.params import SamplingParams


class _FixedTokenExecutor:
    def execute(self, plan, requests):
        return StepResult([[7] for s in plan.spans if s.sample], 0.0)


@dataclass
class CoreBenchResult:
    scenario: str
    running: int
    logging: bool
    steps: int
    us_per_step_median: float
    us_per_step_p90: float
    tokens_per_step: float


def _scenario(name: str, running: int, log: bool, steps: int, seed: int = 0) -> CoreBenchResult:
    import numpy as np

    rng = np.random.default_rng(seed)
    mixed = name == "mixed"
    cfg = EngineConfig(
        cache=CacheConfig(block_size=16, num_blocks=running * 160 + 4096),
        scheduler=SchedulerConfig(max_num_batched_tokens=2048 if mixed else max(512, running),
                                  max_num_seqs=running + 64, max_model_len=8192),
    )
    sink = LogWriter("/dev/null") if log else None
    core = EngineCore(cfg, eos_token_id=None, sink=sink)
    ex = _FixedTokenExecutor()
    params = SamplingParams(max_tokens=4096, ignore_eos=True)
    for _ in range(running):
        core.add_request(rng.integers(0, 32000, size=int(rng.integers(64, 512))).tolist(), params, 0.0)
    # warm up until every request decodes
    while any(r.num_remaining_tokens > 1 for r in core.requests.values()):
        core.step(0.0, ex)
    samples = []
    short = SamplingParams(max_tokens=8, ignore_eos=True)
    gc.collect()
    gc.disable()
    try:
        for i in range(steps):
            if mixed and i % 4 == 0:  # a steady stream of 1k-token prompts chunked into the decodes
                core.add_request(rng.integers(0, 32000, size=1024).tolist(), short, float(i))
            t0 = time.perf_counter()
            out = core.step(float(i), ex)
            samples.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    tokens = out.plan.num_scheduled_tokens
    if sink is not None:
        sink.close()
    samples.sort()
    return CoreBenchResult(name, running, log, steps, samples[len(samples) // 2] * 1e6,
                           samples[int(len(samples) * 0.9)] * 1e6, float(tokens))


def run(steps: int = 300) -> list[CoreBenchResult]:
    from tqdm import tqdm

    plan = [(s, n, log) for s, n in (("decode", 64), ("decode", 256), ("mixed", 256)) for log in (False, True)]
    results = []
    for s, n, log in tqdm(plan, desc="bench core", unit="scenario"):
        results.append(_scenario(s, n, log, steps))
    return results


def report(results: list[CoreBenchResult]) -> str:
    out = io.StringIO()
    out.write(f"{'scenario':<10}{'running':>8}{'log':>6}{'µs/step p50':>14}{'p90':>10}{'tokens/step':>13}\n")
    for r in results:
        out.write(f"{r.scenario:<10}{r.running:>8}{'on' if r.logging else 'off':>6}"
                  f"{r.us_per_step_median:>14.0f}{r.us_per_step_p90:>10.0f}{r.tokens_per_step:>13.0f}\n")
    return out.getvalue()


def as_json(results: list[CoreBenchResult]) -> list[dict]:
    return [asdict(r) for r in results]
