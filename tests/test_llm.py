"""LLM offline API on a tiny Llama with a tokenizer trained in code: prompts of every form, text,
stop strings, chat template, metrics, the event log, batch-independent seeded sampling, errors."""

from __future__ import annotations

import pytest

from runtime.engine.config import ConfigError
from runtime.serving.llm import LLM
from tests.model_helpers import make_tiny, one_thread
from traces.events import Arrived, Finished, Header, Step
from traces.log import fold, read_log
from traces.params import InvalidRequest, SamplingParams

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("llm"), tokenizer=True)


@pytest.fixture(scope="module")
def llm(tiny):
    engine = LLM(str(tiny.folder), device="cpu", block_size=4, num_blocks=256, max_model_len=256)
    yield engine
    engine.close()


def test_prompt_forms_and_greedy_equals_hf(tiny, llm):
    text_prompt = "Hello world"
    ids = llm.tokenizer(text_prompt)["input_ids"]
    single = llm.generate(text_prompt, GREEDY, use_tqdm=False)
    by_ids = llm.generate(ids, GREEDY, use_tqdm=False)
    batch = llm.generate([text_prompt, [5, 6, 7], ids], GREEDY, use_tqdm=False)
    assert len(single) == len(by_ids) == 1 and len(batch) == 3
    ref = tiny.reference(ids, 12)
    for out in (single[0], by_ids[0], batch[0], batch[2]):
        assert out.token_ids == ref
        assert out.finish_reason == "length"
        assert out.prompt_token_ids == ids
    assert single[0].prompt == text_prompt and by_ids[0].prompt is None
    assert batch[1].token_ids == tiny.reference([5, 6, 7], 12)
    assert single[0].text == llm.tokenizer.decode(ref, skip_special_tokens=True)


def test_metrics(llm):
    out = llm.generate([[1, 2, 3], [4, 5]], GREEDY, use_tqdm=False)
    for o in out:
        m = o.metrics
        assert m.num_prompt_tokens == len(o.prompt_token_ids)
        assert 0 <= m.ttft <= m.e2e


def test_stop_string_cuts_text_and_finishes(llm):
    prompt = [9, 8, 7, 6]
    full = llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)[0]
    stop = full.text[len(full.text) // 2: len(full.text) // 2 + 2]
    assert stop.strip(), f"need a visible stop string, text was {full.text!r}"
    cut = llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=(stop,)),
                       use_tqdm=False)[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert len(cut.token_ids) < len(full.token_ids)
    kept = llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=(stop,),
                                               include_stop_str_in_output=True), use_tqdm=False)[0]
    assert kept.text == full.text[: full.text.index(stop) + len(stop)]


def test_chat_uses_the_template(llm, tiny):
    messages = [{"role": "user", "content": "Hello"}]
    out = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = llm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert out.prompt_token_ids == ids
    assert out.token_ids == tiny.reference(ids, 12)
    two = llm.chat([messages, [{"role": "user", "content": "the fox"}]], GREEDY, use_tqdm=False)
    assert len(two) == 2 and two[0].token_ids == out.token_ids


def test_seeded_sampling_is_batch_independent(llm):
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = llm.generate([[3, 1, 4, 1, 5]], params, use_tqdm=False)[0].token_ids
    others = SamplingParams(max_tokens=14, temperature=0.8, ignore_eos=True)
    crowd = llm.generate([[2, 7], [3, 1, 4, 1, 5], [9] * 20], [others, params, others], use_tqdm=False)
    assert crowd[1].token_ids == alone


def test_event_log(tiny, tmp_path):
    path = tmp_path / "run.jsonl"
    with LLM(str(tiny.folder), device="cpu", block_size=4, num_blocks=64, max_model_len=128, trace=str(path)) as llm:
        outs = llm.generate([[1, 2, 3, 4, 5, 6], [7, 8]], GREEDY, use_tqdm=False)
        live = llm.core.block_manager.snapshot()
    events = list(read_log(path))
    header = events[0]
    assert isinstance(header, Header) and header.clock == "wall"
    assert header.model_identity == llm.parts.loaded.identity and header.num_blocks == 64
    assert header.extra["kv"]["num_layers"] == 2 and header.block_size == 4
    assert sum(isinstance(e, Arrived) for e in events) == 2
    assert sum(isinstance(e, Finished) for e in events) == 2
    steps = [e for e in events if isinstance(e, Step)]
    assert all(s.end >= s.start for s in steps)
    logged = {}
    for s in steps:
        for span, toks in zip([sp for sp in s.spans if sp.sample], s.tokens):
            logged.setdefault(span.request_id, []).extend(toks)
    assert [logged[0], logged[1]] == [o.token_ids for o in outs]
    assert fold(events).block_state() == live


def test_errors(tiny, llm):
    with pytest.raises(ConfigError, match="max_num_sequences"):
        LLM(str(tiny.folder), device="cpu", max_num_sequences=3)
    with pytest.raises(InvalidRequest, match="max_model_len"):
        llm.generate([[1] * 300], GREEDY, use_tqdm=False)
    with pytest.raises(InvalidRequest, match="sampling params"):
        llm.generate([[1], [2]], [GREEDY], use_tqdm=False)


def test_token_prompts_without_tokenizer(tmp_path):
    tiny = make_tiny("qwen3", tmp_path)
    with LLM(str(tiny.folder), device="cpu", block_size=4, num_blocks=64, max_model_len=128) as llm:
        out = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0]
        assert out.token_ids == tiny.reference([1, 2, 3], 12) and out.text == ""
        with pytest.raises(InvalidRequest, match="tokenizer"):
            llm.generate("text", GREEDY, use_tqdm=False)
