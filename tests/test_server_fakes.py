"""The server tests' engine (no tests here): a deterministic fake executor on a real core. A light
module: the engine process imports it to build the same engine (tests/test_server_harness.py)."""

from __future__ import annotations

import hashlib
import time

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from runtime.serving.llm_engine import LLMEngine, new_run_id
from traces.events import make_header
from traces.log import LogWriter
from traces.request_names import RUN_ID_KEY

EOS = 2


class PromptSeededExecutor:
    """Token at position p = f(prompt tokens, p): identical answers for identical prompts.
    ``gate``: each step waits for it (a stalled engine); ``delay``: seconds per step."""

    def __init__(self, vocab: int, gate=None, delay: float = 0.0, logprobs: bool = False) -> None:
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


def fake_llm_engine(tokenizer, gate=None, delay: float = 0.0, logprobs: bool = False, num_blocks: int = 256,
                    max_model_len: int = 1024, log: str | None = None) -> LLMEngine:
    """The engine of every server test (a module-level function: the engine process builds it too)."""
    cfg = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=num_blocks),
                       scheduler=SchedulerConfig(max_num_batched_tokens=256, max_model_len=max_model_len))
    writer = LogWriter(log) if log else None
    run_id = new_run_id()
    if writer is not None:  # (with the run's name, as a served engine's log has it)
        writer(make_header(cfg, clock="wall", eos_token_id=EOS, extra={RUN_ID_KEY: run_id}))
    core = EngineCore(cfg, eos_token_id=EOS, sink=writer)
    executor = PromptSeededExecutor(len(tokenizer), gate, delay, logprobs)
    return LLMEngine.from_core(core, executor, tokenizer, overlap=True, writer=writer, run_id=run_id)


class Exploding(PromptSeededExecutor):
    """Raises in the step that runs a prompt starting with token 99 (an engine bug)."""

    secret = "zebra-umbrella-417"

    def execute(self, plan, requests):
        if any(requests[span.request_id].token_ids[0] == 99 for span in plan.spans):
            raise RuntimeError(f"exploded on {self.secret}")  # as if quoting a prompt: never shown
        return super().execute(plan, requests)

    launch = execute


def exploding_llm_engine(tokenizer) -> LLMEngine:
    engine = fake_llm_engine(tokenizer)
    return LLMEngine.from_core(engine.core, Exploding(len(tokenizer)), tokenizer, overlap=True, run_id=engine.run_id)
