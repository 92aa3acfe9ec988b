"""Stops act on the committed stream of a speculating request: a stop string inside a rejected
draft does not stop; one that the committed tokens complete does, and the response ends at the
token that completed it whatever else its round committed."""

from __future__ import annotations

import pytest

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.serving.llm_engine import LLMEngine
from tests.helpers import OracleDrafter, VerifyingExecutor
from tests.smollm2_tokenizer import load
from traces.params import SamplingParams

BASE = 1000  # target tokens BASE..BASE+vocab: ordinary word pieces of SmolLM2's vocabulary


class Target(VerifyingExecutor):
    def token(self, request_id: int, position: int) -> int:
        return BASE + super().token(request_id, position)


class WrongDrafter:
    """Always proposes ``token`` (which the target never samples): every draft is rejected."""

    num_tokens = 3

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, requests, limits):
        return [[self.token] * n for n in limits]


def run(drafter, params, prompt=(BASE, BASE + 1, BASE + 2)):
    tok = load()
    cfg = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=64),
                       scheduler=SchedulerConfig(max_num_batched_tokens=64, max_model_len=128),
                       speculative="" if drafter is None else "ngram:4")
    core = EngineCore(cfg, eos_token_id=None, drafter=drafter)
    engine = LLMEngine.from_core(core, TARGET, tok)
    rid = engine.add_request(list(prompt), params)
    text, ids, n = "", [], 0
    while not engine.is_finished(rid):
        for out in engine.step():
            text += out.text
            ids += out.token_ids
            n = out.num_output_tokens
            assert n == len(ids)
    assert core.block_manager.num_used_blocks == 0
    return text, ids, out.finish_reason


TARGET = Target(vocab=2000)


def target_text(n):
    tok = load()
    return tok.decode([TARGET.token(0, 3 + i) for i in range(n)])


@pytest.mark.parametrize("rate", [1.0, 0.7])
@pytest.mark.parametrize("end", [9, 11])  # (at rate 1: inside a round of 5 tokens; its last)
def test_a_stop_string_the_committed_tokens_complete_stops_there(rate, end):
    ids = [TARGET.token(0, 3 + i) for i in range(30)]
    tok = load()
    stop = tok.decode(ids[end - 2:end])  # completed by output token ``end``
    params = SamplingParams(max_tokens=30, stop=[stop])
    plain = run(None, params)
    spec = run(OracleDrafter(TARGET, 4, rate), params)
    assert plain[2] == "stop" and spec == plain
    assert len(plain[1]) <= end


def test_a_stop_string_in_a_rejected_draft_does_not_stop():
    tok = load()
    wrong = 7000
    params = SamplingParams(max_tokens=20, stop=[tok.decode([wrong])])
    assert tok.decode([wrong]) not in target_text(20)
    plain = run(None, params)
    spec = run(WrongDrafter(wrong), params)
    assert spec == plain and plain[2] == "length" and len(plain[1]) == 20


@pytest.mark.parametrize("drafter", [None, "oracle"])
def test_a_stop_string_ends_its_request_in_the_commit_and_the_log_keeps_what_the_response_does(drafter):
    """No call back into the core: the step that completed the stop string logs its Finished (at the
    step's end, before the next step) and only the tokens the response keeps (a speculative round's
    later tokens are cut, as a stop token cuts them)."""
    from traces.events import Finished, Step

    ids = [TARGET.token(0, 3 + i) for i in range(30)]
    tok = load()
    params = SamplingParams(max_tokens=30, stop=[tok.decode(ids[7:9])])  # completed by output token 9
    cfg = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=64),
                       scheduler=SchedulerConfig(max_num_batched_tokens=64, max_model_len=128),
                       speculative="" if drafter is None else "ngram:4")
    events: list = []
    core = EngineCore(cfg, eos_token_id=None, sink=events.append,
                      drafter=None if drafter is None else OracleDrafter(TARGET, 4, 1.0))
    core.finish = None  # (the engine never calls it)
    engine = LLMEngine.from_core(core, TARGET, tok)
    rid = engine.add_request([BASE, BASE + 1, BASE + 2], params)
    out_ids = []
    while not engine.is_finished(rid):
        for out in engine.step():
            out_ids += out.token_ids
    assert out.finish_reason == "stop" and len(out_ids) == 9
    logged = [t for ev in events if isinstance(ev, Step) for t in ev.tokens[0]] if events else []
    assert logged == out_ids  # the log's tokens are the response's
    last_step = max(i for i, ev in enumerate(events) if isinstance(ev, Step))
    finished = events[last_step + 1]
    assert isinstance(finished, Finished) and finished.reason == "stop" and finished.num_output_tokens == 9
    assert finished.time == events[last_step].end
    assert core.block_manager.num_used_blocks == 0
