"""Shared harness of the server tests (no tests here): a deterministic fake executor, an engine and
a live server around it, and the checks every bad-input test ends with (the server still serves,
no KV block leaked).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import openai
from fastapi import FastAPI

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.llm_engine import LLMEngine
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread

EOS = 2


class PromptSeededExecutor:
    """Token at position p = f(prompt tokens, p): identical answers for identical prompts.
    ``gate``: each step waits for it (a stalled engine); ``delay``: seconds per step."""

    def __init__(self, vocab: int, gate: threading.Event | None = None, delay: float = 0.0,
                 logprobs: bool = False) -> None:
        self.vocab, self.gate, self.delay, self.logprobs = vocab, gate, delay, logprobs

    def token(self, req, position: int) -> int:
        d = hashlib.blake2b(req.token_ids[: req.num_prompt_tokens].tobytes() + position.to_bytes(4, "little"),
                            digest_size=4).digest()
        return 3 + int.from_bytes(d, "little") % (self.vocab - 3)  # never eos / specials 0..2

    def execute(self, plan, requests):
        if self.gate is not None:
            self.gate.wait()
        if self.delay:
            time.sleep(self.delay)
        toks = [[self.token(requests[s.request_id], s.start + s.num_tokens)] for s in plan.spans if s.sample]
        lps = [[{t[0]: -0.5}] for t in toks] if self.logprobs else None
        return StepResult(toks, 0.001, lps)

    # overlapping executor: the server tests run with async scheduling (aborts drain the step in flight)
    launch = execute

    def collect(self, handle):
        return handle


def make_engine(tokenizer, gate=None, max_pending=64, output_queue_size=4096, num_blocks=256, delay=0.0,
                max_model_len=1024, sink: Callable | None = None, logprobs: bool = False) -> AsyncLLMEngine:
    cfg = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=num_blocks),
                       scheduler=SchedulerConfig(max_num_batched_tokens=256, max_model_len=max_model_len))
    core = EngineCore(cfg, eos_token_id=EOS, sink=sink)
    executor = PromptSeededExecutor(len(tokenizer), gate, delay, logprobs)
    engine = LLMEngine.from_core(core, executor, tokenizer, overlap=True)
    return AsyncLLMEngine(engine, max_pending=max_pending, output_queue_size=output_queue_size)


@dataclass
class Served:
    engine: AsyncLLMEngine
    http: ServerThread
    client: openai.OpenAI
    app: FastAPI

    @property
    def url(self) -> str:
        return self.http.url


@contextlib.contextmanager
def serve(tokenizer, name: str = "m", api_key: str | None = None, max_request_bytes: int | None = None,
          app_tokenizer=None, **engine_kwargs) -> Iterator[Served]:
    """A started engine behind a live HTTP server; stopped on exit. ``app_tokenizer``: what the
    HTTP layer tokenizes with (default: the engine's)."""
    engine = make_engine(tokenizer, **engine_kwargs)
    engine.start()
    limits = {} if max_request_bytes is None else {"max_request_bytes": max_request_bytes}
    try:
        app = create_app(engine, app_tokenizer or tokenizer, name, api_key=api_key, **limits)
        with ServerThread(app) as http:
            client = openai.OpenAI(base_url=http.url + "/v1", api_key=api_key or "unused", max_retries=0)
            yield Served(engine, http, client, app)
    finally:
        engine.shutdown()


def wait_idle(engine: AsyncLLMEngine, timeout: float = 10.0) -> None:
    """Wait until the engine has nothing to do; then no KV block may be held."""
    deadline = time.monotonic() + timeout
    while engine.engine.busy or not engine.commands.empty():
        assert time.monotonic() < deadline, "engine did not go idle"
        time.sleep(0.01)
    bm = engine.core.block_manager
    bm.check_invariants()
    assert bm.num_used_blocks == 0 and bm.total_reserved == 0, "leaked KV blocks"


def assert_still_serving(s: Served, model: str = "m") -> None:
    """After a bad request: the engine is alive, a normal request succeeds, nothing leaked."""
    assert s.engine.alive
    out = s.client.completions.create(model=model, prompt="still there?", max_tokens=3)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3
    wait_idle(s.engine)


class TokenizerProxy:
    """The real tokenizer, with faults and a call count: ``fail_decode`` / ``fail_encode`` make
    those raise (an unexpected server bug); ``encode_calls`` counts tokenizations."""

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self.fail_decode = self.fail_encode = False
        self.encode_calls = 0

    def __len__(self) -> int:
        return len(self._tok)

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, text, *args, **kwargs):
        self.encode_calls += 1
        if self.fail_encode:
            raise RuntimeError(f"encode failed on {text!r}")  # quotes the prompt: must stay out of logs
        return self._tok(text, *args, **kwargs)

    def apply_chat_template(self, messages, *args, **kwargs):
        self.encode_calls += 1
        if self.fail_encode:
            raise RuntimeError(f"template failed on {messages!r}")
        return self._tok.apply_chat_template(messages, *args, **kwargs)

    def decode(self, ids, *args, **kwargs):
        if self.fail_decode:
            raise RuntimeError("decode failed")
        return self._tok.decode(ids, *args, **kwargs)
