"""LLMEngine, the step-level API: text deltas that add up to the LLM's output and HF's tokens,
is_finished, abort at any point (KV freed), priority under --policy priority, errors."""

from __future__ import annotations

import pytest

from runtime.serving.llm_engine import LLMEngine
from tests.model_helpers import make_tiny, one_thread
from traces.params import SamplingParams

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("llm_engine"), tokenizer=True)


def make_engine(tiny, **options) -> LLMEngine:
    return LLMEngine(str(tiny.folder), device="cpu", block_size=4, num_blocks=64, max_model_len=128, **options)


def test_step_streams_text_deltas_that_add_up(tiny):
    engine = make_engine(tiny)
    prompt = "Hello world"
    rid = engine.add_request(prompt, max_tokens=10, temperature=0, ignore_eos=True)
    other = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0), ignore_eos=True)
    text, ids, steps = "", [], 0
    while not engine.is_finished(rid):
        steps += 1
        for out in engine.step():
            if out.request_id == rid:
                text += out.text
                ids += out.token_ids
                assert out.num_output_tokens == len(ids)
                assert out.finished == engine.is_finished(rid)
    assert steps >= 10 and engine.is_finished(other)
    ref = tiny.reference(engine.encode(prompt), 10)
    assert ids == ref
    assert text == engine.tokenizer.decode(ref, skip_special_tokens=True)
    assert engine.core.block_manager.num_used_blocks == 0
    assert engine.step() == [] and not engine.busy


def test_abort_frees_the_kv_and_ends_the_request(tiny):
    engine = make_engine(tiny)
    a = engine.add_request([1, 2, 3, 4, 5], max_tokens=50, ignore_eos=True)
    b = engine.add_request([6, 7, 8], max_tokens=3, ignore_eos=True)
    engine.step()
    assert not engine.is_finished(a)
    assert engine.abort(a) and engine.is_finished(a)
    assert not engine.abort(a)  # idempotent
    while engine.busy:
        engine.step()
    assert engine.is_finished(b)
    assert engine.core.block_manager.num_used_blocks == 0
    assert engine.stats.requests_finished == {"length": 1}
    with pytest.raises(KeyError):
        engine.is_finished(99)


def test_priority_takes_effect_under_the_priority_policy(tiny):
    firsts = {}
    for policy in ("fcfs", "priority"):
        engine = make_engine(tiny, policy=policy, max_num_seqs=1)
        low = engine.add_request([1, 2, 3], max_tokens=2, ignore_eos=True, priority=5)
        high = engine.add_request([4, 5, 6], max_tokens=2, ignore_eos=True, priority=0)
        first = None
        while first is None:
            first = next((o.request_id for o in engine.step()), None)
        firsts[policy] = {low: "low", high: "high"}[first]
    assert firsts == {"fcfs": "low", "priority": "high"}


def test_bad_sampling_fields_name_the_field(tiny):
    engine = make_engine(tiny)
    with pytest.raises(ValueError, match="temperature"):
        engine.add_request("x", temperature=-1)
    with pytest.raises(TypeError):
        engine.add_request("x", no_such_field=1)
    assert not engine.has_unfinished()
