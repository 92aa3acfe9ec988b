"""Speculative decoding test helpers: a drafter of chosen acceptance and a checked driver over the
real model runner (CPU or CUDA)."""

from __future__ import annotations

import hashlib

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.executor.config import RunnerConfig
from runtime.executor.model_runner import ModelRunner
from tests.helpers import run_checked
from traces.events import Step
from traces.speculation import rounds

BLOCK = 4


class ReplayDrafter:
    """Proposes what a plain run committed, each draft wrong (off by one) with probability
    ``1 - rate`` by a hash of (request, position): a drafter of chosen acceptance."""

    def __init__(self, plain: dict[tuple, list[int]], num_tokens: int, rate: float) -> None:
        self.plain, self.num_tokens, self.rate = plain, num_tokens, rate

    def propose(self, requests, limits):
        out = []
        for req, n in zip(requests, limits):
            done = req.num_output_tokens
            want = self.plain[tuple(req.prompt_token_ids)][done:done + n]
            drafts = []
            for i, t in enumerate(want):
                h = hashlib.blake2b(f"{req.request_id}/{done + i}".encode(), digest_size=8).digest()
                right = int.from_bytes(h, "little") / 2**64 < self.rate
                drafts.append(t if right else (t + 1) % 320)
            out.append(drafts)
        return out


def drive(loaded, prompts, params, *, speculative="", drafter=None, num_blocks=28, budget=16, max_num_seqs=6,
          runner=None, prefix_caching=True, runner_config: RunnerConfig | None = None):
    """Run ``prompts`` (all at once) to completion, checked after every step (tests.helpers.run_checked);
    returns (outputs, logprobs by request, events, core, runner)."""
    config = EngineConfig(cache=CacheConfig(block_size=BLOCK, num_blocks=num_blocks,
                                            enable_prefix_caching=prefix_caching),
                          scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                                    max_model_len=128), speculative=speculative, seed=3)
    rc = runner_config or RunnerConfig(attention_backend="torch", device="cpu")
    runner = runner or ModelRunner(loaded, rc, config)
    events: list = []
    core = EngineCore(config, sink=events.append, drafter=drafter)
    params = params if isinstance(params, list) else [params] * len(prompts)
    for p, sp in zip(prompts, params):
        core.add_request(p, sp, 0.0)
    outputs: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    logprobs: dict[int, list] = {i: [] for i in range(len(prompts))}

    def on_step(out):
        for d in out.deltas:
            outputs[d.request_id].extend(d.new_token_ids)
            if d.logprobs is not None:
                assert len(d.logprobs) == len(d.new_token_ids)
                logprobs[d.request_id].extend(d.logprobs)

    run_checked(core, runner, events, on_step=on_step)
    return outputs, logprobs, events, core, runner


def spec_rounds(events):
    return [r for e in events if isinstance(e, Step) for r in rounds(e)]


def by_prompt(prompts, outputs):
    return {tuple(p): outputs[i] for i, p in enumerate(prompts)}
