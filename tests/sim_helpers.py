"""Helpers for simulator tests: a live-style driver that records a log, and small workloads.

``record_live`` is the reference for what a live engine does with a workload, written without
the simulator: arrivals up to ``now`` are added before a step is scheduled, arrivals up to the step's
end are added before it is committed, an idle engine jumps to the next arrival.
"""

from __future__ import annotations

from pathlib import Path

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from simulator.replay.replay import recorded_tokens  # noqa: F401  (tests import it from here)
from tests.helpers import SeededTokenExecutor
from traces.events import make_header
from traces.generators import generate
from traces.params import SamplingParams
from traces.prompt import PromptIds, PromptSynthetic
from traces.workload import RequestSpec, Workload

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "data" / "traces"  # the public traces the repository carries
DATA = Path(__file__).resolve().parent / "data"


class VaryingDurationExecutor(SeededTokenExecutor):
    """Seeded tokens; the duration depends on the step's shape (so steps differ in length)."""

    def execute(self, plan, requests):
        result = super().execute(plan, requests)
        tokens = sum(s.num_tokens for s in plan.spans)
        return StepResult(result.token_ids, 0.002 + 1e-5 * tokens + 3e-4 * len(plan.spans))


def record_live(workload: Workload, config: EngineConfig, executor, *, tables: list | None = None) -> list:
    """Drive EngineCore over ``workload`` like a live engine would; return the events (Header first).

    ``tables``: if given, receives per step the block tables the executor saw (copies).
    """
    events: list = [make_header(config, clock="wall")]
    core = EngineCore(config, eos_token_id=None, sink=events.append)
    specs = workload.requests
    i, now = 0, 0.0

    def arrive_until(t: float) -> None:
        nonlocal i
        while i < len(specs) and specs[i].arrival <= t:
            s = specs[i]
            core.add_request(s.prompt, s.params, now=s.arrival, priority=s.priority)
            i += 1

    while True:
        arrive_until(now)
        plan = core.schedule(now)
        if plan.empty:
            assert not core.has_unfinished(), "live driver stalled"
            if i == len(specs):
                return events
            now = specs[i].arrival
            continue
        if tables is not None:
            tables.append([list(t) for t in plan.block_tables])
        result = executor.execute(plan, core.requests)
        end = now + result.duration
        arrive_until(end)
        core.commit(plan, result, now)
        now = end


def record_async_style(workload: Workload, config: EngineConfig, executor, overhead: float = 4e-4) -> list:
    """Drive EngineCore the way AsyncLLMEngine does: requests are taken in between steps and
    stamped with the time they are taken in; the engine spends ``overhead`` seconds between taking
    requests in and scheduling (so step k+1 starts later than step k ended)."""
    events: list = [make_header(config, clock="wall")]
    core = EngineCore(config, eos_token_id=None, sink=events.append)
    specs = workload.requests
    i, now = 0, 0.0
    while True:
        if not core.has_unfinished():
            if i == len(specs):
                return events
            now = max(now, specs[i].arrival)  # blocked until the next request comes in
        while i < len(specs) and specs[i].arrival <= now:
            s = specs[i]
            core.add_request(s.prompt, s.params, now=now, priority=s.priority)
            i += 1
        now += overhead
        plan = core.schedule(now)
        assert not plan.empty
        result = executor.execute(plan, core.requests)
        core.commit(plan, result, now)
        now += result.duration


def small_config(*, chunked: bool = True, num_blocks: int = 256, budget: int = 256, block_size: int = 16,
                 prefix: bool = True, max_num_seqs: int = 32, policy: str = "fcfs", seed: int = 0) -> EngineConfig:
    return EngineConfig(
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                  enable_chunked_prefill=chunked, max_model_len=1024, policy=policy),
        model_identity="test-model", seed=seed)


def mixed_workload(n: int = 60, seed: int = 0, rate: float = 40.0) -> Workload:
    """Bursty arrivals, prompts sharing a 64-token prefix, plus a few token-id prompts."""
    wl = generate(n, rate=rate, cv=2.0, input_len="uniform:8:200", output_len="uniform:1:40",
                  shared_prefix=64, seed=seed)
    extra = [RequestSpec(arrival=wl.requests[k].arrival, prompt=PromptIds(list(range(k, k + 50))),
                         params=SamplingParams(max_tokens=7, ignore_eos=True), priority=k % 3)
             for k in range(0, n, 10)]
    return Workload(wl.requests + extra, seed=seed, source="mixed")


def synthetic(n: int, **kw) -> PromptSynthetic:
    return PromptSynthetic(num_tokens=n, **kw)


# what VaryingDurationExecutor charges: 2 ms + 10 µs per token + 0.3 ms per span
VARYING_TRUTH = {"const": 0.002, "prefill_tokens": 1e-5, "decode_seqs": 1e-5, "seqs": 3e-4}


def record_on_off(tmp: Path, n: int = 40) -> tuple[Path, Path]:
    """Two live-style logs of one workload (VaryingDurationExecutor): chunked on (budget 64) and off."""
    from traces.log import LogWriter

    paths = []
    for name, config in (("on", small_config(num_blocks=64, budget=64)),
                         ("off", small_config(num_blocks=64, budget=1024, chunked=False))):
        path = tmp / f"{name}.jsonl"
        with LogWriter(path) as w:
            for ev in record_live(mixed_workload(n, seed=5, rate=30), config, VaryingDurationExecutor(seed=2)):
                w(ev)
        paths.append(path)
    return paths[0], paths[1]
