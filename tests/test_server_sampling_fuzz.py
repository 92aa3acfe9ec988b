"""Fuzz the sampling parameters through the HTTP server with the official ``openai`` client, over
a real model runner and sampler (a tiny random Llama; on a GPU too): every answer is a 200 or a
400 naming a field, every token is inside the vocabulary, and the engine outlives them all with no
KV block held. Values run from the ordinary to what float32 cannot hold (1e-300, 1e308,
subnormals) and integers past 64 bits (the client sends no NaN; tests/test_server_errors.py does)."""

from __future__ import annotations

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")  # (a GPU machine may lack the dev extra)
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from runtime.serving.async_engine import AsyncLLMEngine  # noqa: E402
from runtime.serving.llm_engine import LLMEngine  # noqa: E402
from runtime.serving.server.app import create_app  # noqa: E402
from runtime.serving.server.launch import ServerThread  # noqa: E402
from tests.model_helpers import make_tiny  # noqa: E402
from tests.test_server_harness import wait_idle  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]

EXTREME_FLOATS = [0.0, -0.0, 1e-300, -1e-300, 5e-324, 1e-45, 1e-40, 1e-38, 1e-5, 1e-4, 0.01, 0.5, 1.0, 1.5,
                  2.0, 2.0000001, 100.0, 100.1, 3.5e38, 1e308, -1e308]
EXTREME_INTS = [-(2**70), -(2**63), -2, -1, 0, 1, 2, 3, 5, 319, 320, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**70]

def edge(lo: float, hi: float) -> st.SearchStrategy:
    """Valid values, their edges above all (where float32 rounds)."""
    return st.sampled_from([v for v in EXTREME_FLOATS if lo <= v <= hi]) | st.floats(lo, hi)


def int_edge(lo: int, hi: int) -> st.SearchStrategy:
    return st.sampled_from([v for v in EXTREME_INTS if lo <= v <= hi]) | st.integers(lo, min(hi, 400))


VALID = {
    "temperature": edge(0, 2), "top_p": edge(1e-300, 1), "top_k": int_edge(-1, 2**31 - 1), "min_p": edge(0, 1),
    "presence_penalty": edge(-2, 2), "frequency_penalty": edge(-2, 2), "repetition_penalty": edge(0.01, 100),
    "seed": int_edge(-(2**63), 2**63 - 1), "max_tokens": int_edge(1, 4), "min_tokens": int_edge(0, 1),
    "n": int_edge(1, 3), "ignore_eos": st.booleans(), "stop": st.lists(st.text(min_size=1, max_size=3), max_size=3),
    "stop_token_ids": st.lists(int_edge(0, 2**31 - 1), max_size=3),
}
COMPLETION = {**VALID, "logprobs": int_edge(0, 20)}
CHAT = {**{k: v for k, v in VALID.items() if k != "max_tokens"}, "max_completion_tokens": int_edge(1, 4),
        "logprobs": st.just(True), "top_logprobs": int_edge(0, 20)}
WILD = st.sampled_from(EXTREME_FLOATS + EXTREME_INTS) | st.floats(allow_nan=False, allow_infinity=False) | \
    st.integers() | st.text(max_size=300) | st.lists(st.integers() | st.text(max_size=2), max_size=3) | st.none()


@st.composite
def bodies(draw, fields: dict) -> dict:
    """A valid body (each field present or not); a third of the time one field made anything at all."""
    body = draw(st.fixed_dictionaries({}, optional=fields))
    if draw(st.integers(0, 2)) == 0:
        body[draw(st.sampled_from(sorted(fields)))] = draw(WILD)
    return body


@pytest.fixture(scope="module", params=DEVICES)
def served(request, tmp_path_factory):
    tiny = make_tiny("llama", tmp_path_factory.mktemp("fuzz"), tokenizer=True)
    engine = LLMEngine(str(tiny.folder), device=request.param, block_size=4, num_blocks=128, max_model_len=64)
    front = AsyncLLMEngine(engine, max_pending=64)
    front.start()
    try:
        with ServerThread(create_app(front, engine.tokenizer, "m")) as http:
            client = openai.OpenAI(base_url=http.url + "/v1", api_key="unused", max_retries=0, timeout=60)
            yield front, http, client, engine.vocab_size
    finally:
        front.shutdown()


def _split(body: dict) -> tuple[dict, dict]:
    """The fields the client takes as keywords, and the rest (vLLM's extensions) as extra_body."""
    known = {"temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "max_tokens", "n", "stop",
             "logprobs", "top_logprobs", "max_completion_tokens"}
    return {k: v for k, v in body.items() if k in known}, {k: v for k, v in body.items() if k not in known}


def _answered(call, vocab: int) -> None:
    """A 200 whose tokens are all in the vocabulary, or a 400 that names a field."""
    try:
        out = call()
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"], e.body
        return
    for c in out.choices:
        assert c.finish_reason in ("stop", "length"), c
    assert out.usage.completion_tokens >= 1


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=bodies(COMPLETION))
def test_completions_never_hurt_the_engine(served, body):
    front, _, client, vocab = served
    kwargs, extra_body = _split(body)
    _answered(lambda: client.completions.create(model="m", prompt="Hi", extra_body=extra_body, **kwargs), vocab)
    assert front.alive


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=bodies(CHAT))
def test_chat_never_hurts_the_engine(served, body):
    front, _, client, vocab = served
    kwargs, extra_body = _split(body)
    messages = [{"role": "user", "content": "Hi"}]
    _answered(lambda: client.chat.completions.create(model="m", messages=messages, extra_body=extra_body,
                                                     **kwargs), vocab)
    assert front.alive


def test_the_repetition_penalty_that_killed_the_engine_is_a_400(served):
    front, http, client, _ = served
    for value in (1e-300, 1e-40, 1e308, 0.0):
        body = {"prompt": "Hi", "max_tokens": 2, "repetition_penalty": value}
        r = httpx.post(http.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty", r.text
    ok = httpx.post(http.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "repetition_penalty": 0.01})
    assert ok.status_code == 200


def test_after_the_fuzz_the_engine_serves_and_holds_no_kv(served):
    front, http, client, vocab = served
    assert front.alive and httpx.get(http.url + "/health").status_code == 200
    out = client.completions.create(model="m", prompt="still there?", max_tokens=3,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3
    wait_idle(front)
