"""A row whose logits go NaN or infinite: the sampler flags it and still returns an id inside the
vocabulary; the engine aborts that request alone (an error to its client, ``Aborted`` in the log)
while the others get the tokens they would have got without it."""

from __future__ import annotations

import random

import pytest
import torch

from runtime.executor.model_runner import NONFINITE_LOGITS
from runtime.serving.llm_engine import LLMEngine
from tests.model_helpers import make_tiny, one_thread
from tests.sampling_reference import sample
from traces.events import Aborted, Finished
from traces.log import read_log
from traces.params import SamplingParams as SP

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

V = 50
NAN, INF = float("nan"), float("inf")
POISON = 300  # a token whose embedding is NaN: every logit of a request that reads it is NaN


def _rows() -> torch.Tensor:
    x = torch.randn(6, V, generator=torch.Generator().manual_seed(0)) * 3
    x[1, 7] = NAN
    x[3] = NAN
    x[4, 11] = INF
    x[5] = -INF
    return x


BAD = {1, 3, 4, 5}


@pytest.mark.parametrize("params", [
    [SP(temperature=0)] * 6,
    [SP()] * 6,
    [SP(top_p=0.9, top_k=5, min_p=0.01)] * 6,
    [SP(temperature=0), SP(), SP(top_k=3), SP(temperature=0, logprobs=2), SP(logprobs=3), SP(top_p=0.5)],
    [SP(repetition_penalty=1.5, presence_penalty=1.0)] * 6,
], ids=["greedy", "sampled", "filtered", "mixed", "penalties"])
def test_non_finite_rows_are_flagged_and_their_ids_stay_in_the_vocabulary(params):
    x = _rows()
    rngs = [None if p.temperature == 0 else random.Random(i) for i, p in enumerate(params)]
    hists = [([1, 2, 3], 1)] * 6
    out = sample(x, params, rngs, hists)
    assert set(out.nonfinite) == BAD
    assert all(0 <= t < V for t in out.token_ids)
    # the finite rows drew what they draw without the others
    for i in set(range(6)) - BAD:
        alone = sample(x[i:i + 1], [params[i]], [None if rngs[i] is None else random.Random(i)], [hists[i]])
        assert alone.token_ids[0] == out.token_ids[i] and alone.nonfinite == ()


def test_an_overflowing_temperature_division_is_flagged():
    x = torch.zeros(2, V)
    x[1, 0] = 3e38  # finite, but / 1e-4 is past float32
    out = sample(x, [SP(temperature=1e-4)] * 2, [random.Random(0), random.Random(1)])
    assert out.nonfinite == (1,) and all(0 <= t < V for t in out.token_ids)


def test_some_minus_infinity_is_not_non_finite():
    x = torch.zeros(1, V)
    x[0, :40] = -INF  # masked tokens: weight 0, not an error
    out = sample(x, [SP()], [random.Random(0)])
    assert out.nonfinite == () and 40 <= out.token_ids[0] < V


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = make_tiny("llama", tmp_path_factory.mktemp("nonfinite"), tokenizer=True)
    return model


def _engine(tiny, poisoned: bool, log=None, **options) -> LLMEngine:
    engine = LLMEngine(str(tiny.folder), device="cpu", block_size=4, num_blocks=64, max_model_len=128,
                       trace=str(log) if log else None, **options)
    if poisoned:
        with torch.no_grad():
            engine.parts.runner.model.embed_tokens.weight[POISON] = NAN  # (llama: not tied to the head)
    return engine


def _run(engine: LLMEngine, requests: dict[str, tuple[list[int], SP]]) -> dict[str, dict]:
    rids = {engine.add_request(prompt, params): name for name, (prompt, params) in requests.items()}
    got = {name: {"ids": [], "text": "", "finish": None, "error": None} for name in requests}
    while engine.has_unfinished() or engine.busy:
        for d in engine.step():
            g = got[rids[d.request_id]]
            g["ids"] += d.token_ids
            g["text"] += d.text
            if d.finished:
                g["finish"], g["error"] = d.finish_reason, d.error
    engine.close()
    return got


@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
def test_the_request_with_nan_logits_is_aborted_alone(tiny, tmp_path, overlap):
    requests = {
        "greedy": ([5, 6, 7, 8], SP(max_tokens=12, temperature=0, ignore_eos=True)),
        "sampled": ([9, 10, 11], SP(max_tokens=10, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True)),
    }
    clean = _run(_engine(tiny, False, async_scheduling=overlap), requests)
    log = tmp_path / "live.jsonl"
    engine = _engine(tiny, True, log, async_scheduling=overlap)
    got = _run(engine, {**requests, "poisoned": ([POISON, 5, 6], SP(max_tokens=10, temperature=0.8,
                                                                       ignore_eos=True))})
    bad = got.pop("poisoned")
    assert bad == {"ids": [], "text": "", "finish": "abort", "error": NONFINITE_LOGITS}
    assert got == clean  # the others: the same tokens, the same text
    events = list(read_log(log))
    aborted = [e for e in events if isinstance(e, Aborted)]
    assert [(e.request_id, e.reason) for e in aborted] == [(2, NONFINITE_LOGITS)]
    assert {e.request_id for e in events if isinstance(e, Finished)} == {0, 1}
    assert engine.stats.requests_aborted == {NONFINITE_LOGITS: 1}
    assert engine.core.block_manager.num_used_blocks == 0


def test_its_client_gets_an_error_and_the_server_goes_on(tiny):
    import httpx

    from runtime.serving.async_engine import AsyncLLMEngine
    from runtime.serving.server.app import create_app
    from runtime.serving.server.launch import ServerThread

    engine = _engine(tiny, True)
    front = AsyncLLMEngine(engine)
    front.start()
    try:
        with ServerThread(create_app(front, engine.tokenizer, "m")) as http:
            url = http.url + "/v1/completions"
            r = httpx.post(url, json={"prompt": [POISON, 5, 6], "max_tokens": 4}, timeout=30)
            assert r.status_code == 500, r.text
            error = r.json()["error"]
            assert error["code"] == "request_aborted" and NONFINITE_LOGITS in error["message"]
            streamed = httpx.post(url, json={"prompt": [POISON, 7], "max_tokens": 4, "stream": True}, timeout=30)
            events = [line[5:].strip() for line in streamed.text.splitlines() if line.startswith("data:")]
            assert events[-1] == "[DONE]" and '"request_aborted"' in events[-2]
            ok = httpx.post(url, json={"prompt": [5, 6], "max_tokens": 4, "ignore_eos": True}, timeout=30)
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
            assert httpx.get(http.url + "/health").status_code == 200
    finally:
        front.shutdown()
    assert engine.stats.requests_aborted == {NONFINITE_LOGITS: 2}
