"""One place that turns ``model + options`` into a ready engine: the loaded model, the EngineConfig
(its ``cache.num_blocks`` = what the KV budget holds, unless fixed), the ModelRunner with that KV
pool, and the log Header. ``LLMEngine`` (so ``LLM`` and the server), the benchmarks and
execute-replay all build engines through here.

Options are the config fields by name: ``RunnerConfig``'s (runtime/executor/config.py),
``CacheConfig``'s and ``SchedulerConfig``'s (runtime/engine/config.py), ``seed`` and ``speculative``;
dotted names (``scheduler.max_num_seqs``) work too. An unknown name raises ConfigError naming it.

``speculative="model:PATH:K"``: the draft model is loaded here, beside the target, and its KV pool
shares the target's budget (``kv_cache_gb``, or what the GPU has free): the target gets as many
blocks as both pools of that many blocks hold (runtime/executor/draft_model.py). The engine cores
``EngineParts.core`` makes use it; the pure drafters (``ngram:K``) are the core's own.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from runtime.engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.drafters import Drafter, SpeculativeError, SpeculativeSpec, ThrottledDrafter, parse_speculative
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import EventSink, Executor
from runtime.executor.config import RunnerConfig
from runtime.executor.cpu_threads import busy_warning, choose_threads, others_load, usable_cores
from runtime.executor.draft_model import (
    build_draft_drafter,
    draft_block_bytes,
    draft_pool_blocks,
    load_draft,
)
from runtime.executor.kv_cache import plan_num_blocks
from runtime.executor.model.loader import LoadedModel, load_model, load_tokenizer
from runtime.executor.model_runner import ModelRunner, logits_rows
from traces.events import Header, make_header

_RUNNER = {f.name for f in dataclasses.fields(RunnerConfig)}
_CACHE = {f.name for f in dataclasses.fields(CacheConfig)}
_SCHED = {f.name for f in dataclasses.fields(SchedulerConfig)}


@dataclass
class EngineParts:
    loaded: LoadedModel
    runner: ModelRunner
    config: EngineConfig
    drafter: ThrottledDrafter | None = None  # ``model:PATH:K``'s (built for the config's spec)
    # seconds each stage of the build took, in order (what a server prints of its start)
    stages: dict[str, float] = dataclasses.field(default_factory=dict)

    def describe_build(self) -> str:
        parts = ", ".join(f"{name} {s:.1f} s" for name, s in self.stages.items())
        return f"engine built in {sum(self.stages.values()):.1f} s ({parts})"

    def header(self, clock: str = "wall") -> Header:
        spec, runner = self.loaded.spec, self.runner
        return make_header(self.config, clock=clock, model_identity=self.loaded.identity,
                           eos_token_id=self.loaded.eos_token_id, extra={
                               "model_path": self.loaded.path,
                               "device": str(runner.device),
                               "dtype": str(runner.dtype).removeprefix("torch."),
                               "attention_backend": runner.backend.name,
                               # the loop's overlap rule (async scheduling on CUDA): how its steps are timed
                               "overlap": self.overlap,
                               "kv": {"num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads,
                                      "head_dim": spec.head_dim, "block_size": runner.block_size,
                                      "num_blocks": runner.num_blocks},
                               # the decode kernel's split policy reads it (traces/decode_splits.py)
                               **({"sms": runner.backend.num_sms} if hasattr(runner.backend, "num_sms") else {}),
                               # prefill steps' padded token counts on CUDA (traces/step_padding.py); 0: eager
                               **({"piecewise_tokens": runner.piecewise.max_tokens if runner.piecewise else 0}
                                  if runner.device.type == "cuda" else {}),
                           })

    def core(self, sink: EventSink | None = None, trace_prompts: str = "ids",
             drafter: Drafter | None = None) -> EngineCore:
        """A fresh core on this runner; ``drafter``: its speculative drafter (default: the config's)."""
        return EngineCore(self.config, eos_token_id=self.loaded.eos_token_id, sink=sink, trace_prompts=trace_prompts,
                          drafter=drafter or self.make_drafter())

    def make_drafter(self) -> Drafter | None:
        """The drafter a core of ``config`` needs from the executor: ``model:PATH:K``'s, loaded once
        (and again only for another spec), with no request of an earlier core; None otherwise (no
        speculation, or a pure drafter the core builds)."""
        spec = parse_speculative(self.config.speculative)
        if spec is None or spec.method != "model":
            return None
        if self.drafter is None or self.drafter.spec != spec:
            self.drafter = _draft_drafter(spec, self.loaded, self.config, self.runner.config)
        self.drafter.reset()
        return self.drafter

    @property
    def overlap(self) -> bool:
        """Whether steps overlap: on CUDA unless async_scheduling is off (on the CPU the forward
        runs inside ``launch``, so there is nothing to overlap)."""
        return self.runner.async_scheduling and self.runner.device.type == "cuda"

    def loop(self, core: EngineCore, clock: Callable[[], float]) -> StepLoop:
        """The step driver for ``core`` on this runner."""
        return StepLoop(core, self.runner, clock, overlap=self.overlap)


def split_options(options: dict[str, Any]) -> tuple[dict, dict, dict, dict]:
    """(runner, cache, scheduler, top-level) option dicts; unknown names raise ConfigError."""
    runner, cache, sched, top = {}, {}, {}, {}
    for key, value in options.items():
        group, _, name = key.rpartition(".")
        if name in _RUNNER and group in ("", "runner"):
            runner[name] = value
        elif name in _CACHE and group in ("", "cache"):
            cache[name] = value
        elif name in _SCHED and group in ("", "scheduler"):
            sched[name] = value
        elif key in ("seed", "speculative"):
            top[key] = value
        else:
            raise ConfigError(f"unknown option {key!r}")
    return runner, cache, sched, top


def default_max_model_len(loaded: LoadedModel) -> int:
    """An engine's max_model_len unless one is given: the scheduler's default, within the model's positions."""
    return min(SchedulerConfig().max_model_len, loaded.spec.max_position_embeddings)


def build_engine(model: str | None = None, *, loaded: LoadedModel | None = None, tokenizer: str | None = None,
                 sync_timing: bool = False, record_steps: bool = False, **options: Any) -> EngineParts:
    """Load ``model`` (or reuse ``loaded``), size and allocate the KV pool, derive the EngineConfig.
    ``tokenizer``: a folder or .gguf whose tokenizer replaces the model's (or stands in for none)."""
    runner_opts, cache_opts, sched_opts, top = split_options(options)
    rc = RunnerConfig(**runner_opts)
    cache = CacheConfig(**cache_opts)  # validated before the (possibly large) model load
    stages, mark = {}, time.perf_counter()

    def stage(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        stages[name], mark = now - mark, now

    if loaded is None:
        loaded = load_model(model, device=rc.device, dtype=rc.dtype, seed=top.get("seed", 0))
    if tokenizer is not None:
        loaded.tokenizer = load_tokenizer(tokenizer)
    if "max_model_len" not in sched_opts:
        sched_opts["max_model_len"] = default_max_model_len(loaded)
    elif sched_opts["max_model_len"] > loaded.model.rotary.max_positions:
        raise ConfigError(f"scheduler.max_model_len {sched_opts['max_model_len']} exceeds the model's "
                          f"{loaded.model.rotary.max_positions} positions")
    sched = SchedulerConfig(**sched_opts)
    spec = _speculative(top.get("speculative", ""))
    draft = None
    if spec is not None and spec.method == "model":  # loaded first: its weights are not the KV budget's
        draft = load_draft(spec, loaded, sched.max_model_len, top.get("seed", 0))
    stage("model")
    if "num_blocks" not in cache_opts:
        extra = {}
        if spec is not None:  # a speculating decode samples 1 + K rows
            extra["logits_rows"] = logits_rows(sched.max_num_seqs, sched.max_num_batched_tokens, spec)
        if draft is not None:  # the draft's pool: a block per target block, and the fed drafts' overhang
            per_block = draft_block_bytes(draft, cache.block_size)
            extra["extra_block_bytes"] = per_block
            extra["reserve_bytes"] = per_block * (draft_pool_blocks(0, cache.block_size, sched.max_num_seqs,
                                                                    spec.num_tokens))
        num_blocks = plan_num_blocks(loaded.spec, loaded.dtype, loaded.device, cache.block_size, rc, sched, **extra)
        cache = dataclasses.replace(cache, num_blocks=num_blocks)
    config = EngineConfig(cache=cache, scheduler=sched, model_identity=loaded.identity, **top)
    if loaded.device.type == "cpu":
        set_cpu_threads(rc.cpu_threads)
    runner = ModelRunner(loaded, rc, config, sync_timing=sync_timing, record_steps=record_steps)
    drafter = None if draft is None else _draft_drafter(spec, loaded, config, rc, draft)
    stage("runner")  # the KV pool's allocation and the CUDA graphs' capture
    return EngineParts(loaded, runner, config, drafter, stages)


def _speculative(text: str) -> SpeculativeSpec | None:
    try:
        return parse_speculative(text)
    except SpeculativeError as e:
        raise ConfigError(f"speculative {e}") from None


def _draft_drafter(spec: SpeculativeSpec, loaded: LoadedModel, config: EngineConfig, rc: RunnerConfig,
                   draft: LoadedModel | None = None) -> ThrottledDrafter:
    """The draft model's drafter, each request throttled by how many of its drafts are kept."""
    sched = config.scheduler
    made = build_draft_drafter(spec, loaded, block_size=config.cache.block_size, num_blocks=config.cache.num_blocks,
                               max_model_len=sched.max_model_len, max_num_seqs=sched.max_num_seqs,
                               attention_backend=rc.attention_backend, enforce_eager=rc.enforce_eager,
                               seed=config.seed, draft=draft)
    return ThrottledDrafter(made)


def set_cpu_threads(requested: int) -> int:
    """torch's thread count for a CPU engine (runtime/executor/cpu_threads.py); warns on a busy machine."""
    if requested == 0 and os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()  # the user's choice, which torch took at import
    cores, busy = usable_cores(), others_load()
    threads = choose_threads(requested, cores)
    torch.set_num_threads(threads)
    if (warning := busy_warning(busy, cores, threads)) is not None:
        print(f"minivllm: warning: {warning}", file=sys.stderr, flush=True)
    return threads


def replay_executor_factory(model: str | None = None, **runner_options: Any) -> Callable[[Header], Executor]:
    """A factory building the real ModelRunner as the recording did: the log's model (unless
    ``model`` says otherwise), dtype (unless given), KV geometry, budget and seed; other
    ``RunnerConfig`` fields from ``runner_options``. ``minivllm replay --execute`` hands it to
    ``simulator.replay.execute.execute_replay``."""

    def make(header: Header) -> Executor:
        sched, extra = header.config.get("scheduler", {}), header.extra
        options = {k: sched[k] for k in ("max_num_batched_tokens", "max_num_seqs", "max_model_len") if k in sched}
        options.update(num_blocks=header.num_blocks, block_size=header.block_size, seed=header.seed)
        runner = {"dtype": extra.get("dtype", "auto"), **runner_options}
        parts = build_engine(model or extra.get("model_path"), **options, **runner)
        identity = parts.loaded.identity
        if header.model_identity and identity != header.model_identity:
            print(f"warning: the log was recorded with model {header.model_identity!r}; replaying on {identity!r}")
        return parts.runner

    return make
