"""What an engine's log keeps of a prompt (``trace_prompts``), so a trace of real traffic need not
hold users' tokens: ``ids``; ``hashes`` (its length and one id per full block, the low 48 bits of
the block's prefix-cache chain hash: equal leading ids ↔ equal prefixes, as the Mooncake traces
carry); ``none`` (its length). The engine itself always runs on the ids."""

from __future__ import annotations

from runtime.engine.block_manager import BlockManager
from runtime.engine.request import Request
from traces.params import SamplingParams
from traces.prompt import TRACE_PROMPTS, Prompt, PromptSynthetic, materialize

SEGMENT_ID_BITS = 48  # a hashed block's id: what PromptSynthetic seeds its tokens with


class PromptRecorder:
    def __init__(self, mode: str, block_manager: BlockManager, max_model_len: int) -> None:
        if mode not in TRACE_PROMPTS:
            raise ValueError(f"trace_prompts must be one of {', '.join(TRACE_PROMPTS)}; got {mode!r}")
        self.mode, self.block_manager, self.max_model_len = mode, block_manager, max_model_len

    def arrived(self, record: Prompt, req: Request) -> Prompt:
        """What an ``Arrived`` event keeps of ``req``'s prompt (``record``: as it was given)."""
        mode = self.mode
        if mode == "ids" or (mode == "hashes" and isinstance(record, PromptSynthetic)):
            return record  # a synthetic prompt holds no one's tokens
        n, rid = req.num_prompt_tokens, req.request_id
        if mode == "none":
            return PromptSynthetic(num_tokens=n, unique_seed=rid)
        mask = (1 << SEGMENT_ID_BITS) - 1
        ids = [h & mask for h in self.block_manager.prompt_hashes(req)]
        return PromptSynthetic(num_tokens=n, unique_seed=rid, segment_ids=ids,
                               segment_len=self.block_manager.block_size)

    def recorded(self, request_id: int, prompt: Prompt, params: SamplingParams,
                 cache_salt: str | None = None) -> Prompt:
        """What the log keeps of a request's prompt, without an engine taking the request: how a log
        recorded with token ids is redacted afterwards (``minivllm log redact``)."""
        req = Request(request_id, materialize(prompt), params, 0.0, self.max_model_len, 0, None, cache_salt)
        try:
            return self.arrived(prompt, req)
        finally:
            self.block_manager.forget(req)

    def rejected(self, record: Prompt, num_tokens: int) -> Prompt | None:
        """What a ``Rejected`` event keeps of a refused prompt: its ids (when the log keeps ids and
        they are not too many to be worth keeping) or a synthetic one as given; else nothing."""
        mode = self.mode
        keep = (mode == "ids" and num_tokens <= self.max_model_len) or (
            mode == "hashes" and isinstance(record, PromptSynthetic))
        return record if keep else None
