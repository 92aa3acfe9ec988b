"""``LLM``: the offline batch API.

    llm = LLM()                                   # default SmolLM2-135M-Instruct, CPU or GPU
    outs = llm.generate(["Hello", "The sky is"], SamplingParams(max_tokens=32, temperature=0))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason, outs[0].metrics.ttft
    llm.chat([{"role": "user", "content": "Hi!"}])

Prompts are strings, token-id lists, or lists of either. Every request goes through the same
EngineCore as the server; time is ``time.monotonic()`` since engine start, passed in as ``now``.
Stop strings are found by the incremental detokenizer (runtime/serving/detokenizer.py); a hit finishes the
request through ``core.finish``.
With ``trace=PATH`` the run's event log (Header first) is written there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.engine.request import Request
from runtime.executor.setup import build_engine
from runtime.serving.detokenizer import DetokenizerDelta, apply_delta, make_detokenizer
from traces.log import LogWriter
from traces.params import InvalidRequest, SamplingParams

PromptInput = str | Sequence[int]


class _NoText:
    """Detokenizer stand-in for models without a tokenizer (token-id prompts only)."""

    def add(self, ids: list[int]) -> DetokenizerDelta:
        return DetokenizerDelta("", False)

    def finish(self) -> DetokenizerDelta:
        return DetokenizerDelta("", False)


def _detokenizer(tokenizer: Any | None, prompt: list[int], params: SamplingParams):
    if tokenizer is None:
        return _NoText()
    return make_detokenizer(tokenizer, prompt, params)


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None
    metrics: RequestMetrics | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class LLM:
    """Offline engine. ``model``: None (default SmolLM2), an HF folder, a .gguf file or
    ``random:<shape>``; ``config``: flat options (see runtime/executor/setup.py) plus ``trace``."""

    def __init__(self, model: str | None = None, *, trace: str | None = None, **config: Any) -> None:
        self.parts = build_engine(model, **config)
        self.tokenizer = self.parts.loaded.tokenizer
        self.writer = LogWriter(trace) if trace else None
        if self.writer is not None:
            self.writer(self.parts.header("wall"))
        self.core = self.parts.core(self.writer)
        self.runner = self.parts.runner
        self.loop = self.parts.loop(self.core, self.now)
        self._extra_eos = self.parts.loaded.spec.eos_token_ids[1:]
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    # --- prompts -----------------------------------------------------------------------------------

    def _encode(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequest("this model has no tokenizer: pass prompts as token-id lists")
            return prompt, list(self.tokenizer(prompt)["input_ids"])
        return None, [int(t) for t in prompt]

    def _params(self, params: SamplingParams) -> SamplingParams:
        if params.n != 1:
            raise InvalidRequest(f"n must be 1 for LLM.generate, got {params.n}")
        if self._extra_eos and not params.ignore_eos:  # e.g. Qwen's <|im_end|> and <|endoftext|>
            extra = tuple(t for t in self._extra_eos if t not in params.stop_token_ids)
            if extra:
                params = msgspec.structs.replace(params, stop_token_ids=params.stop_token_ids + extra)
        return params

    # --- generation ------------------------------------------------------------------------------

    def generate(self, prompts: PromptInput | Sequence[PromptInput],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run ``prompts`` to completion; outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and
                                        isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise InvalidRequest(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
        encoded = [self._encode(p) for p in prompts]
        params = [self._params(p) for p in sampling_params]
        for (_, ids), p in zip(encoded, params):
            self.core.validate(len(ids), p)
        return self._run(encoded, params, use_tqdm)

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | None = None, *, use_tqdm: bool = True,
             **template_kwargs: Any) -> list[RequestOutput]:
        """Prompts rendered by the tokenizer's chat template (one conversation or a list)."""
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequest("this model's tokenizer has no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True,
                                                      **template_kwargs)
            prompts.append(list(self.tokenizer(text, add_special_tokens=False)["input_ids"]))
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run(self, encoded: list[tuple[str | None, list[int]]], params: list[SamplingParams],
             use_tqdm: bool) -> list[RequestOutput]:
        from tqdm import tqdm

        core = self.core
        outputs: dict[int, RequestOutput] = {}
        detoks: dict[int, Any] = {}
        reqs: dict[int, Request] = {}
        order = []
        for (text, ids), p in zip(encoded, params):
            now = self.now()
            rid = core.add_request(ids, p, now)
            order.append(rid)
            reqs[rid] = core.requests[rid]
            outputs[rid] = RequestOutput(rid, text, ids, metrics=RequestMetrics(now, num_prompt_tokens=len(ids)))
            detoks[rid] = _detokenizer(self.tokenizer, ids, p)
        pending = set(order)
        bar = tqdm(total=len(order), desc="generate", unit="req", disable=not use_tqdm or len(order) < 2)
        try:
            while pending:
                for out in self.loop.step():
                    if out.plan.empty:
                        raise RuntimeError(f"engine stalled with {len(pending)} unfinished requests")
                    self._deliver(out, outputs, detoks, reqs, pending, bar)
        except BaseException:
            self.loop.drain()
            for rid in pending:
                core.abort(rid, self.now(), "abort")
            raise
        finally:
            bar.close()
            if self.writer is not None:
                self.writer.flush()
        return [outputs[rid] for rid in order]

    def _deliver(self, out, outputs: dict[int, RequestOutput], detoks: dict, reqs: dict[int, Request],
                 pending: set[int], bar) -> None:
        """Hand one completed step's new tokens to the outputs; stop strings finish requests."""
        now = self.now()
        for delta in out.deltas:
            rid = delta.request_id
            o = outputs[rid]
            if o.metrics.first_token_time is None:
                o.metrics.first_token_time = now
            o.token_ids.extend(delta.new_token_ids)
            if delta.logprobs is not None:
                o.logprobs = (o.logprobs or []) + list(delta.logprobs)
            text, finish, stop_hit = apply_delta(detoks[rid], delta.new_token_ids, delta.finish_reason)
            o.text += text
            if stop_hit:
                self.core.finish(rid, now, "stop")
            if finish is not None:
                o.finish_reason = finish
                o.metrics.finish_time = now
                o.metrics.num_cached_tokens = reqs[rid].num_cached_tokens
                o.metrics.num_preemptions = reqs[rid].num_preemptions
                pending.discard(rid)
                bar.update(1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
