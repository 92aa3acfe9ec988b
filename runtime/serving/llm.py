"""``LLM``: the offline batch API, on top of ``LLMEngine``.

    llm = LLM()                                   # default SmolLM2-135M-Instruct, CPU or GPU
    outs = llm.generate(["Hello", "The sky is"], SamplingParams(max_tokens=32, temperature=0))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason, outs[0].metrics.ttft
    llm.chat([{"role": "user", "content": "Hi!"}])

Prompts are strings, token-id lists, or lists of either; options are the engine's
(runtime/serving/llm_engine.py), ``trace=PATH`` included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.serving.llm_engine import LLMEngine, OutputDelta, PromptInput
from traces.params import InvalidRequest, SamplingParams


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
    error: str | None = None  # why the engine aborted it (finish_reason "abort"), e.g. non-finite logits

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, delta: OutputDelta, now: float) -> None:
        """Append one step's delta (``now``: the engine clock when it was delivered)."""
        m = self.metrics
        m.arrival_time, m.first_token_time = delta.arrival_time, delta.first_token_time
        m.num_cached_tokens, m.num_preemptions = delta.num_cached_tokens, delta.num_preemptions
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(delta.logprobs)
        self.text += delta.text
        if delta.finished:
            self.finish_reason = delta.finish_reason
            self.error = delta.error
            m.finish_time = now


class LLM:
    """Offline engine. ``model``: None (default SmolLM2), an HF folder, a .gguf file or
    ``random:<shape>``; ``options``: the engine's (e.g. ``max_num_seqs=8``) plus ``trace``."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        self.engine = LLMEngine(model, **options)
        self.parts = self.engine.parts
        self.runner = self.parts.runner
        self.core = self.engine.core
        self.tokenizer = self.engine.tokenizer

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
        bad_n = next((p.n for p in sampling_params if p.n != 1), None)
        if bad_n is not None:
            raise InvalidRequest(f"n must be 1 for LLM.generate, got {bad_n}")
        engine = self.engine
        encoded = [engine.encode(p) for p in prompts]
        params = [engine.sampling_params(p) for p in sampling_params]
        for ids, p in zip(encoded, params):  # all or nothing: check every request before adding one
            engine.core.validate(len(ids), p)
        return self._run(prompts, encoded, params, use_tqdm)

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

    def _run(self, prompts: Sequence[PromptInput], encoded: list[list[int]], params: list[SamplingParams],
             use_tqdm: bool) -> list[RequestOutput]:
        from tqdm import tqdm

        engine = self.engine
        outputs: dict[int, RequestOutput] = {}
        for prompt, ids, p in zip(prompts, encoded, params):
            rid = engine.add_request(ids, p)
            text = prompt if isinstance(prompt, str) else None
            metrics = RequestMetrics(engine.now(), num_prompt_tokens=len(ids))
            outputs[rid] = RequestOutput(rid, text, ids, metrics=metrics)
        pending = set(outputs)
        bar = tqdm(total=len(outputs), desc="generate", unit="req", disable=not use_tqdm or len(outputs) < 2)
        try:
            while pending:
                deltas = engine.step()
                now = engine.now()
                for delta in deltas:
                    outputs[delta.request_id].add(delta, now)
                    if delta.finished:
                        pending.discard(delta.request_id)
                        bar.update(1)
        except BaseException:
            for rid in pending:
                engine.abort(rid)
            raise
        finally:
            bar.close()
            if engine.writer is not None:
                engine.writer.flush()
        return list(outputs.values())

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
