"""Workloads and cost models for the capacity-planning tests (importable by Ray's workers, which run
from the repository root like the tests)."""

from __future__ import annotations

import copy
import os
import signal

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.planning.grid import Grid
from runtime.planning.job import SharedInputs
from runtime.planning.sweep import Plan
from simulator.cost.cost_model import CostModel
from traces.generators import generate
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic
from traces.workload import RequestSpec, Workload


class FlatCost(CostModel):
    """2 ms a step plus 20 µs a token: latencies that depend on the batch."""

    def __init__(self, const: float = 0.002, per_token: float = 2e-5) -> None:
        self.const, self.per_token = const, per_token

    def step_time(self, step, spans, verifying=()):
        return self.const + self.per_token * sum(s.num_tokens for s in spans)

    def scaled(self, factor: float) -> FlatCost:
        new = copy.copy(self)
        new.const, new.per_token = self.const * factor, self.per_token * factor
        return new


class ConstantStep(CostModel):
    """Every step takes ``seconds``, whatever it carries."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step_time(self, step, spans, verifying=()):
        return self.seconds

    def scaled(self, factor: float) -> ConstantStep:
        return ConstantStep(self.seconds * factor)


class FailsOnBigBatches(FlatCost):
    """FlatCost that can't price a step of more than ``most`` spans (an error in the model)."""

    def __init__(self, most: int = 6) -> None:
        super().__init__()
        self.most = most

    def step_time(self, step, spans, verifying=()):
        if len(spans) > self.most:
            raise RuntimeError("no model for so many spans")
        return super().step_time(step, spans, verifying)


class KillsItsWorkerOnce(FlatCost):
    """FlatCost whose first step anywhere kills the process running it (SIGKILL, as the kernel's
    OOM killer would), once: the marker file says it happened."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def step_time(self, step, spans, verifying=()):
        try:  # created exclusively: of two workers that step at once, only one dies
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return super().step_time(step, spans, verifying)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


def small_workload(n: int = 40, seed: int = 0) -> Workload:
    return generate(n, rate=50.0, cv=1.0, input_len="uniform:16:300", output_len="uniform:2:40", seed=seed)


def evenly_spaced(n: int, gap: float, prompt: int = 16, output: int = 4) -> Workload:
    """``n`` requests of equal shape, one every ``gap`` seconds."""
    params = SamplingParams(max_tokens=output, ignore_eos=True)
    return Workload([RequestSpec(arrival=i * gap, prompt=PromptSynthetic(num_tokens=prompt, unique_seed=i),
                                 params=params) for i in range(n)])


def base_config(max_num_seqs: int = 32) -> EngineConfig:
    return EngineConfig(cache=CacheConfig(num_blocks=512),
                        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=max_num_seqs,
                                                  max_model_len=1024), model_identity="test-model")


def small_plan(grid: str = "chunked=on,off replicas=1,2 router=round-robin,least-loaded",
               rate_scales: tuple[float, ...] = (1.0, 3.0)) -> Plan:
    return Plan(Grid.parse(grid), rate_scales, base_config(), {})


def small_inputs(model=None) -> SharedInputs:
    return SharedInputs(small_workload(), model or FlatCost(), "flat")
