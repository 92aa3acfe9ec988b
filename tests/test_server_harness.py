"""Shared harness of the server tests (no tests here): the fake engine of tests/test_server_fakes.py
and a live server around it — the engine on a thread of this process or in a process of its own
(``mode``: "thread" | "process"; MODES parametrizes a test over both) — and the checks every
bad-input test ends with (the server still serves, no KV block leaked).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
from fastapi import FastAPI

from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.engine_main import EngineSpec
from runtime.serving.engine_process import EngineProcess
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from tests.test_server_fakes import fake_llm_engine
from traces.log import read_log

MODES = ("thread", "process")


def make_engine(tokenizer, mode: str = "thread", max_pending: int = 64, output_queue_size: int = 4096,
                **engine_kwargs) -> AsyncLLMEngine:
    """A front end over ``fake_llm_engine(tokenizer, **engine_kwargs)``, not started."""
    limits = {"max_pending": max_pending, "output_queue_size": output_queue_size}
    if mode == "thread":
        return AsyncLLMEngine(fake_llm_engine(tokenizer, **engine_kwargs), **limits)
    spec = EngineSpec(fake_llm_engine, {"tokenizer": tokenizer, **engine_kwargs}, warmup=False)
    return AsyncLLMEngine(connection=EngineProcess(spec, start_timeout=120), **limits)


def make_gate(mode: str):
    """An event the engine's steps wait for, where the engine runs."""
    return multiprocessing.get_context("spawn").Event() if mode == "process" else threading.Event()


@dataclass
class Served:
    engine: AsyncLLMEngine
    http: ServerThread
    client: openai.OpenAI
    app: FastAPI
    mode: str
    gate: object = None  # set() lets the stalled engine go on
    log: Path | None = None

    @property
    def url(self) -> str:
        return self.http.url

    def events(self) -> list:
        """The engine's log so far (flushed after every loop iteration: read it once settled)."""
        return list(read_log(self.log)) if self.log is not None else []


@contextlib.contextmanager
def serve(tokenizer, name: str = "m", api_key: str | None = None, max_request_bytes: int | None = None,
          app_tokenizer=None, mode: str = "thread", gate: bool = False, log: Path | None = None,
          **engine_kwargs) -> Iterator[Served]:
    """A started engine behind a live HTTP server; stopped on exit. ``app_tokenizer``: what the
    HTTP layer tokenizes with (default: the engine's); ``gate``: steps wait for ``Served.gate``;
    ``log``: the engine records its event log there (``Served.events()``)."""
    the_gate = make_gate(mode) if gate else None
    engine = make_engine(tokenizer, mode, gate=the_gate, log=str(log) if log else None, **engine_kwargs)
    engine.start()
    limits = {} if max_request_bytes is None else {"max_request_bytes": max_request_bytes}
    app = None
    try:
        app = create_app(engine, app_tokenizer or tokenizer, name, api_key=api_key, **limits)
        with ServerThread(app) as http:
            client = openai.OpenAI(base_url=http.url + "/v1", api_key=api_key or "unused", max_retries=0)
            yield Served(engine, http, client, app, mode, the_gate, log)
    finally:
        if the_gate is not None:
            the_gate.set()
        if app is not None:
            app.state.server.close()
        engine.shutdown()


def wait_until(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def wait_idle(engine: AsyncLLMEngine, timeout: float = 10.0) -> None:
    """Wait until the engine took every command and has nothing to do; then no KV block may be held
    (as its last message says; in process, its block manager's invariants too)."""
    wait_until(lambda: engine.settled, timeout, "the engine to go idle")
    state = engine.state
    assert state.kv_blocks_used == 0 and state.kv_blocks_reserved == 0, "leaked KV blocks"
    if engine.engine is not None:
        bm = engine.engine.core.block_manager
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
        if name.startswith("__"):  # (pickle's look-ups on a bare copy: an intake worker gets one)
            raise AttributeError(name)
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

    def convert_ids_to_tokens(self, ids, *args, **kwargs):  # (what logprobs read a token's bytes from)
        if self.fail_decode:
            raise RuntimeError("decode failed")
        return self._tok.convert_ids_to_tokens(ids, *args, **kwargs)
