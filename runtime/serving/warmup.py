"""Warm-up before a server says it is ready: run the step shapes serving will hit, so kernel
compilation (Triton specialises integer arguments on ==1 and divisibility by 16), allocator growth
and lazy initialisation happen here and not in a user's request.

The requests run on a scratch core over the same runner (same weights and KV pool, nothing
logged); the runner then forgets them (``ModelRunner.reset``), so the served engine starts as if
freshly built. CUDA graphs are captured when the runner is built; this covers what runs eagerly
beside them: the attention of steps with prefill, decode batches the graphs don't hold, sampling
with every kind of parameter.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.engine.core import EngineCore
from runtime.serving.llm_engine import LLMEngine
from traces.params import SamplingParams


@dataclass(frozen=True)
class WarmupReport:
    steps: int
    seconds: float
    requests: int


def _phases(engine: LLMEngine) -> list[list[tuple[int, SamplingParams, int]]]:
    """Waves of (prompt length, params, steps into the wave before it is added); each wave runs to
    completion before the next starts."""
    config = engine.core.config
    sched, cache = config.scheduler, config.cache
    longest = min(sched.max_model_len - 8, cache.num_blocks * cache.block_size // 2)
    seqs = sched.max_num_seqs
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    sampled = [
        SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True),
        SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, top_k=20, min_p=0.05, ignore_eos=True),
        SamplingParams(max_tokens=4, temperature=0.7, repetition_penalty=1.1, presence_penalty=0.1,
                       frequency_penalty=0.1, logprobs=2, ignore_eos=True),
    ]
    waves: list[list[tuple[int, SamplingParams, int]]] = []
    # decode batches of 1, 2, 16, 17 and the most, prompts of 16 and 17 tokens
    for n in sorted({b for b in (1, 2, 16, 17, min(seqs, 64), seqs) if b <= seqs}):
        waves.append([(16 + i % 2, greedy, 0) for i in range(n)])
    # one chunk of the whole budget, then a chunk of 17 over that context
    if longest > 32:
        waves.append([(min(longest, sched.max_num_batched_tokens + 17), SamplingParams(max_tokens=2,
                                                                                       ignore_eos=True), 0)])
    # prompt chunks of 16, 17 and 33 tokens beside 1, 16 and 17 decodes (mixed steps)
    for decodes in (1, 16, 17):
        if decodes < seqs:
            long_decode = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
            waves.append([(16, long_decode, 0)] * decodes + [(n, greedy, 2 + k) for k, n in enumerate((16, 17, 33))])
    # every sampling path in one batch; then the sampling kernel's other specialisations: sampled rows
    # picked out of a batch or all of it, logits as the model gives them or penalised (float32)
    waves.append([(24, p, 0) for p in (greedy, *sampled)])
    waves += [[(24, p, 0) for p in wave] for wave in ([greedy, sampled[0]], sampled[:2], sampled[2:])]
    return waves


def warm_up(engine: LLMEngine, *, on_step: Callable[[int], None] | None = None, seed: int = 0) -> WarmupReport:
    """Run the warm-up waves on a scratch core over ``engine``'s executor."""
    t0 = time.perf_counter()
    drafter = engine.core.drafter  # (a draft model's is the executor's: the scratch core shares it)
    scratch = LLMEngine.from_core(EngineCore(engine.core.config, eos_token_id=None, drafter=drafter), engine.executor,
                                  overlap=engine.loop.overlap)
    rng = random.Random(seed)
    vocab = min(1000, engine.vocab_size or 256)  # ids that every model and tokenizer here knows
    steps = requests = 0
    shared = [rng.randrange(3, vocab) for _ in range(48)]
    for wave in _phases(engine):
        waiting = sorted(wave, key=lambda item: item[2])
        wave_steps = 0
        while waiting or scratch.busy:
            while waiting and waiting[0][2] <= wave_steps:
                length, params, _ = waiting.pop(0)
                scratch.add_request([rng.randrange(3, vocab) for _ in range(length)], params)
                requests += 1
            scratch.step()
            steps += 1
            wave_steps += 1
            if on_step is not None:
                on_step(steps)
    # a prefix hit: the same 48-token prefix twice, one after the other (a prefill over cached blocks)
    for tail in (5, 9):
        scratch.add_request(shared + [rng.randrange(3, vocab) for _ in range(tail)],
                            SamplingParams(max_tokens=2, ignore_eos=True))
        requests += 1
        while scratch.busy:
            scratch.step()
            steps += 1
    for part in (engine.executor, drafter):
        reset = getattr(part, "reset", None)
        if reset is not None:
            reset()
    return WarmupReport(steps, time.perf_counter() - t0, requests)
