"""What differs between /v1/completions and /v1/chat/completions, and nothing else: the request
body (and the counts checked on it raw, before it is parsed), how it becomes
prompt ids and sampling params, and the shape of a choice (whole or as a stream's chunk). The one
handler that serves both is ``app.handler``."""

from __future__ import annotations

from typing import Any

from msgspec import Raw

from runtime.serving.server.prompts import Prompts
from runtime.serving.server.protocol import ChatCompletionRequest, CompletionRequest
from runtime.serving.server.responses import Render
from runtime.serving.server.token_text import ChoiceTokens
from traces.params import SamplingParams


class Completions:
    path = "/v1/completions"
    body = CompletionRequest
    id_prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"
    prompt_param = "prompt"  # what a too-long error names

    def precheck(self, prompts: Prompts, body: dict[str, Raw]) -> None:
        prompts.precheck_completion(body)

    async def prompts(self, prompts: Prompts, req: CompletionRequest) -> list[list[int]]:
        return await prompts.completion(req.prompt, req.n)

    def prompts_now(self, prompts: Prompts, req: CompletionRequest) -> list[list[int]]:
        return prompts.completion_now(req.prompt, req.n)

    def without_prompt(self, req: CompletionRequest) -> CompletionRequest:
        return req.model_copy(update={"prompt": ""})

    def sampling_params(self, req: CompletionRequest) -> SamplingParams:
        return req.sampling_params(req.requested_max_tokens, req.logprobs)

    def has_logprobs(self, req: CompletionRequest) -> bool:
        return req.logprobs is not None

    def logprobs(self, render: Render, req: CompletionRequest, token_ids: list[int], logprobs: list | None,
                 tokens: ChoiceTokens) -> dict | None:
        return render.completion_logprobs(token_ids, logprobs, tokens)

    def choice(self, i: int, text: str, finish: str | None, logprobs: dict | None) -> dict:
        return {"index": i, "text": text, "finish_reason": finish, "logprobs": logprobs}

    chunk = choice

    def first_chunks(self, base: dict, n: int) -> list[dict]:
        return []


class Chat:
    path = "/v1/chat/completions"
    body = ChatCompletionRequest
    id_prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"
    prompt_param = "messages"

    def precheck(self, prompts: Prompts, body: dict[str, Raw]) -> None:
        prompts.precheck_chat(body)

    async def prompts(self, prompts: Prompts, req: ChatCompletionRequest) -> list[list[int]]:
        req.check()
        return [await prompts.chat(req)]

    def prompts_now(self, prompts: Prompts, req: ChatCompletionRequest) -> list[list[int]]:
        req.check()
        return [prompts.chat_now(req)]

    def without_prompt(self, req: ChatCompletionRequest) -> ChatCompletionRequest:
        return req.model_copy(update={"messages": []})

    def sampling_params(self, req: ChatCompletionRequest) -> SamplingParams:
        top = req.top_logprobs or 0
        return req.sampling_params(req.requested_max_tokens, max(top, 1) if req.logprobs else None)

    def has_logprobs(self, req: ChatCompletionRequest) -> bool:
        return req.logprobs

    def logprobs(self, render: Render, req: ChatCompletionRequest, token_ids: list[int], logprobs: list | None,
                 tokens: ChoiceTokens) -> dict | None:
        return render.chat_logprobs(token_ids, logprobs, req.top_logprobs or 0, tokens)

    def choice(self, i: int, text: str, finish: str | None, logprobs: dict | None) -> dict:
        return {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                "logprobs": logprobs}

    def chunk(self, i: int, text: str, finish: str | None, logprobs: dict | None) -> dict:
        return {"index": i, "delta": {"content": text} if text else {}, "finish_reason": finish, "logprobs": logprobs}

    def first_chunks(self, base: dict, n: int) -> list[dict]:
        """A stream opens with each choice's role, as OpenAI's does."""
        return [{**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": None}]} for i in range(n)]


ENDPOINTS: tuple[Any, ...] = (Completions(), Chat())
