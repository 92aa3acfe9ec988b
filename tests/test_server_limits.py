"""Slow work stays off the event loop, oversized bodies get 413, overlong
prompts are refused early and the error names the right field. Every test ends with the server
still serving and no KV block leaked."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from runtime.serving.server.app import DEFAULT_MAX_REQUEST_BYTES
from tests.test_server_harness import MODES, TokenizerProxy, assert_still_serving, serve

LIMIT = 128 << 10  # the small servers' --max-request-bytes


@pytest.fixture(scope="module", params=MODES)
def served(request, smollm2_tokenizer):
    proxy = TokenizerProxy(smollm2_tokenizer)
    with serve(smollm2_tokenizer, app_tokenizer=proxy, max_request_bytes=LIMIT, mode=request.param) as s:
        s.proxy = proxy
        yield s


def _error(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text
    return r.json()["error"]


# --- 413 --------------------------------------------------------------------------------------------


def test_default_limit_is_8_mib():
    assert DEFAULT_MAX_REQUEST_BYTES == 8 << 20


def test_body_over_the_limit_by_content_length_is_413(served):
    body = b'{"prompt": "' + b"a" * LIMIT + b'"}'
    r = httpx.post(served.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413
    err = _error(r)
    assert err["code"] == "request_too_large" and str(LIMIT) in err["message"]
    assert_still_serving(served)


def test_chunked_body_over_the_limit_is_413(served):
    def chunks():  # no Content-Length: Transfer-Encoding: chunked
        yield b'{"prompt": "'
        for _ in range(2 * LIMIT // 4096):
            yield b"a" * 4096
        yield b'"}'

    r = httpx.post(served.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413 and _error(r)["code"] == "request_too_large"
    assert_still_serving(served)


def test_chunked_body_under_the_limit_is_served(served):
    def chunks():
        yield b'{"prompt": "hello", '
        yield b'"max_tokens": 2}'

    r = httpx.post(served.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert_still_serving(served)


# --- overlong prompts: the field named, refused before the expensive work -----------------------------


def _bad(call) -> dict:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    return err.value.body


def test_token_prompt_too_long_names_prompt(served):
    body = _bad(lambda: served.client.completions.create(model="m", prompt=[5] * 1100, max_tokens=1))
    assert body["param"] == "prompt" and "max_model_len" in body["message"]
    assert_still_serving(served)


def test_text_prompt_too_long_names_prompt(served):
    text = "hello world " * 1000  # ~2000 tokens; under the character bound, so it is tokenized first
    body = _bad(lambda: served.client.completions.create(model="m", prompt=text, max_tokens=1))
    assert body["param"] == "prompt" and "max_model_len" in body["message"]
    assert text[:20] not in body["message"]  # the field is named, its content never quoted
    assert_still_serving(served)


def test_chat_too_long_names_messages(served):
    text = "hello world " * 1000
    body = _bad(lambda: served.client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=1))
    assert body["param"] == "messages"
    assert_still_serving(served)


def test_prompt_that_fits_but_not_with_max_tokens_names_max_tokens(served):
    body = _bad(lambda: served.client.completions.create(model="m", prompt=[5] * 1000, max_tokens=100))
    assert body["param"] == "max_tokens" and "max_model_len" in body["message"]
    body = _bad(lambda: served.client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5000))
    assert body["param"] == "max_completion_tokens"
    body = _bad(lambda: served.client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5000))
    assert body["param"] == "max_tokens"
    assert_still_serving(served)


def test_unset_max_tokens_shrinks_to_the_room_left(served):
    out = served.client.completions.create(model="m", prompt=[5] * 1020)  # default 16 > the 4 left
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 4
    assert_still_serving(served)


def test_huge_text_prompt_is_refused_before_tokenizing(served):
    served.proxy.encode_calls = 0
    text = "a" * 100_000  # at least 100000 / 81 (SmolLM2's longest token) > 1024 = max_model_len tokens
    for call in (lambda: served.client.completions.create(model="m", prompt=text, max_tokens=1),
                 lambda: served.client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}],
                                                               max_tokens=1)):
        body = _bad(call)
        assert body["param"] in ("prompt", "messages") and "characters" in body["message"]
    assert served.proxy.encode_calls == 0
    assert_still_serving(served)


def test_batch_bigger_than_the_queue_is_refused_before_tokenizing(served):
    served.proxy.encode_calls = 0
    body = _bad(lambda: served.client.completions.create(model="m", prompt=["hi"] * 40, n=2, max_tokens=1))
    assert body["param"] == "prompt" and "max_pending" in body["message"]
    assert served.proxy.encode_calls == 0
    assert_still_serving(served)


# --- the event loop never waits on tokenization -----------------------------------------------------


def test_health_answers_while_a_huge_prompt_is_tokenized(smollm2_tokenizer):
    # a context and KV pool big enough that a 3 MB prompt passes the character bound: it really is
    # tokenized (seconds), then refused for its max_tokens
    with serve(smollm2_tokenizer, max_model_len=1 << 20, num_blocks=1 << 16, max_request_bytes=16 << 20,
               mode="process") as s:  # the server as `minivllm serve` runs it
        text = "hello world, this is a test. " * (3_000_000 // 29)
        result = {}

        def big() -> None:
            t0 = time.perf_counter()
            result["r"] = httpx.post(s.url + "/v1/completions", json={"prompt": text, "max_tokens": 1 << 20},
                                     timeout=120)
            result["elapsed"] = time.perf_counter() - t0

        worker = threading.Thread(target=big)
        worker.start()
        time.sleep(0.2)  # the upload and JSON parse are done; tokenizing
        latencies = []
        with httpx.Client(timeout=30) as client:
            while worker.is_alive():
                t0 = time.perf_counter()
                assert client.get(s.url + "/health").status_code == 200
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.05)
        worker.join()
        r = result["r"]
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"  # tokenized, then refused
        # a blocked loop would hold a probe for the whole tokenization
        assert len(latencies) >= 3, (latencies, result["elapsed"])
        assert max(latencies) < max(0.25, 0.3 * result["elapsed"]), (max(latencies), result["elapsed"])
        assert_still_serving(s)
