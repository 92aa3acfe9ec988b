"""``minivllm profile --for WORKLOAD|LOG``: sweep limits that cover what a workload will ask of a
cost model, so a simulation of it stays inside the profiled range.

From a recorded log: its longest request, its largest decode batch and its longest prefill step.
From a workload (a trace, a saved or generated workload): its longest request and longest prompt,
and the largest decode batch of a re-simulation under ``config`` (a plain linear model; only
the batch sizes matter, and they come from the scheduler, not the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.cli.errors import CLIError

# a stand-in model for the batch sizes only: 10 ms a step, 20 µs a prefill token
_BATCHING_MODEL = {"const": 0.01, "prefill_tokens": 2e-5, "decode_seqs": 1e-4}


@dataclass(frozen=True)
class WorkloadShape:
    max_request: int  # prompt + output tokens of the longest request
    max_prompt: int
    max_batch: int  # most sequences one step decodes
    source: str

    def describe(self) -> str:
        return (f"{self.source}: longest request {self.max_request:,} tokens, longest prompt {self.max_prompt:,}, "
                f"largest decode batch {self.max_batch:,}")


def workload_shape(path: str, options: dict) -> WorkloadShape:
    """``options``: the engine options given (``build_engine``'s keywords); the scheduler's shape the batches."""
    from analysis.frames import load_frames
    from traces.formats import detect_format, load_workload

    if not Path(path).exists():
        raise CLIError(f"--for: {path}: no such workload or log")
    try:
        if detect_format(path) == "log":
            frames = load_frames(path)
            if len(frames.steps):
                req = frames.requests
                return WorkloadShape(int((req["num_prompt_tokens"] + req["num_output_tokens"]).max()),
                                     int(req["num_prompt_tokens"].max()), int(frames.steps["decode_seqs"].max()),
                                     f"the log {path}")
        workload = load_workload(path)
    except ValueError as e:
        raise CLIError(f"--for: {e}") from None
    if not len(workload):
        raise CLIError(f"--for: {path}: no requests")
    return WorkloadShape(workload.max_request_tokens(), max(r.num_prompt_tokens for r in workload),
                         _simulated_batch(workload, options), f"the workload {path}")


def _simulated_batch(workload, options: dict) -> int:
    import dataclasses

    from analysis.frames import FrameBuilder
    from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from simulator.cost.linear_model import LinearCostModel
    from simulator.sim import simulate

    fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    sched = {k: v for k, v in options.items() if k in fields}
    sched["max_model_len"] = workload.max_request_tokens() + 1
    config = EngineConfig(cache=CacheConfig(num_blocks=1 << 16), scheduler=SchedulerConfig(**sched))
    frames = FrameBuilder()
    simulate(workload, config, LinearCostModel(_BATCHING_MODEL), sink=frames)
    steps = frames.frames().steps
    return int(steps["decode_seqs"].max()) if len(steps) else 1
