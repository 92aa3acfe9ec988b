"""No request gets a plain-text 5xx; unsupported content and
non-finite numbers are 400s naming the field; ``top_k: -1`` means off. Every test ends with the
server still serving and no KV block leaked."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from runtime.serving.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.test_server_harness import MODES, TokenizerProxy, assert_still_serving, serve, wait_idle
from traces.events import Arrived

SECRET = "zebra-umbrella-417"  # prompt text that must never show up in an error or a log


@pytest.fixture(scope="module", params=MODES)
def served(request, smollm2_tokenizer, tmp_path_factory):
    proxy = TokenizerProxy(smollm2_tokenizer)
    log = tmp_path_factory.mktemp("errors") / "log.jsonl"
    with serve(smollm2_tokenizer, app_tokenizer=proxy, log=log, logprobs=True, mode=request.param) as s:
        s.proxy = proxy
        yield s


def _post(s, path: str, body: dict) -> httpx.Response:
    # json.dumps writes float("inf") as Infinity, which Python's parser (and so FastAPI's) accepts
    return httpx.post(s.url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=30)


def _error(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text
    return r.json()["error"]


# --- 1. unsupported content, unexpected exceptions ------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_image_url_part_is_400_naming_the_part(served, stream):
    content = [{"type": "text", "text": f"describe {SECRET}"}, {"type": "image_url", "image_url": {"url": "x"}}]
    with pytest.raises(openai.BadRequestError) as err:
        served.client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                              max_tokens=2, stream=stream)
    body = err.value.body
    assert body["param"] == "messages[0].content[1].type" and "image_url" in body["message"]
    assert body["type"] == "invalid_request_error" and SECRET not in body["message"]
    assert_still_serving(served)


def test_non_string_text_part_is_400(served):
    parts = [{"type": "text", "text": 5}]
    r = _post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400 and _error(r)["param"] == "messages[0].content[0].text"
    assert_still_serving(served)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unexpected_exception_is_a_json_500_without_the_prompt(served, path, caplog):
    body = ({"prompt": f"tell me about {SECRET}"} if path == "/v1/completions"
            else {"messages": [{"role": "user", "content": f"tell me about {SECRET}"}]})
    served.proxy.fail_encode = True
    try:
        with caplog.at_level(logging.DEBUG):
            r = _post(served, path, {**body, "max_tokens": 2})
    finally:
        served.proxy.fail_encode = False
    assert r.status_code == 500
    err = _error(r)
    assert err["type"] == "server_error" and err["code"] == "internal_error" and "RuntimeError" in err["message"]
    assert SECRET not in r.text and SECRET not in caplog.text
    assert "unhandled RuntimeError" in caplog.text  # logged: type and stack
    assert_still_serving(served)


def test_whole_response_failing_is_a_json_500(served):
    served.proxy.fail_decode = True  # logprob text is decoded while building the response
    try:
        r = _post(served, "/v1/completions", {"prompt": "hi", "max_tokens": 3, "logprobs": 1})
    finally:
        served.proxy.fail_decode = False
    assert r.status_code == 500 and _error(r)["code"] == "internal_error"
    assert_still_serving(served)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stream_failing_after_start_ends_with_an_error_event(served, path):
    body = ({"prompt": "hi", "logprobs": 1} if path == "/v1/completions"
            else {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 1})
    served.proxy.fail_decode = True
    try:
        with httpx.stream("POST", served.url + path, json={**body, "max_tokens": 4, "stream": True},
                          timeout=30) as r:
            assert r.status_code == 200  # the stream had started
            data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    finally:
        served.proxy.fail_decode = False
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    with pytest.raises(openai.APIError):  # and the official client raises it
        served.proxy.fail_decode = True
        try:
            for _ in served.client.completions.create(model="m", prompt="hi", max_tokens=4, logprobs=1, stream=True):
                pass
        finally:
            served.proxy.fail_decode = False
    assert_still_serving(served)


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        (b"{not json", "application/json"),
        (b'"a string"', "application/json"),
        (b"\xff\xfe\x00garbage", "application/json"),
        (b'{"prompt": "hi"}', "text/plain"),
        (b'{"prompt": "\\ud800"}', "application/json"),  # a lone surrogate: valid JSON, not encodable
        (b'{"prompt": "hi", "stop": ["\\udfff"]}', "application/json"),
        (b'{"prompt": "hi", "seed": 99999999999999999999999999}', "application/json"),
        (b'{"prompt": "hi", "priority": -99999999999999999999999999}', "application/json"),
        (b'{"prompt": "hi", "top_k": 99999999999999999999}', "application/json"),
        (b'{"prompt": "hi", "stop_token_ids": [99999999999999999999]}', "application/json"),
        (b'{"prompt": [[1, 2], []]}', "application/json"),
        (b'{"prompt": []}', "application/json"),
        (b'{"prompt": "hi", "max_tokens": 99999999999999999999999}', "application/json"),
    ],
)
def test_malformed_bodies_are_4xx_json(served, raw, content_type):
    r = httpx.post(served.url + "/v1/completions", content=raw, headers={"content-type": content_type}, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    assert _error(r)["type"] == "invalid_request_error"
    assert_still_serving(served)


def test_chat_lone_surrogate_names_the_message(served):
    r = httpx.post(served.url + "/v1/chat/completions", timeout=30, headers={"content-type": "application/json"},
                   content=b'{"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\\ud800"}]}')
    assert r.status_code == 400 and _error(r)["param"] == "messages[1].content"
    assert_still_serving(served)


# --- 2. non-finite numbers --------------------------------------------------------------------------

FLOAT_FIELDS = sorted({name for model in (CompletionRequest, ChatCompletionRequest)
                       for name, f in model.model_fields.items() if f.annotation in (float, "float")})


def test_every_float_field_is_covered():
    assert {"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_floats_are_400_naming_the_field(served, path, field):
    base = ({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    for value in (float("inf"), float("-inf"), float("nan")):
        r = _post(served, path, {**base, "max_tokens": 2, field: value})
        assert r.status_code == 400, (field, value, r.text)
        err = _error(r)
        assert err["param"] == field and "finite" in err["message"]
    assert_still_serving(served)


# --- 7. top_k = -1 ------------------------------------------------------------------------------------


def test_top_k_minus_one_means_off(served):
    wait_idle(served.engine)
    before = len(served.events())
    out = served.client.completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"top_k": -1})
    assert out.choices[0].finish_reason == "length"
    chat = served.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2, extra_body={"top_k": -1})
    assert chat.choices[0].finish_reason == "length"
    wait_idle(served.engine)
    arrived = [e for e in served.events()[before:] if isinstance(e, Arrived)]
    assert len(arrived) == 2 and all(e.params.top_k == 0 for e in arrived)  # the engine's "off"
    with pytest.raises(openai.BadRequestError) as err:
        served.client.completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"top_k": -2})
    assert err.value.body["param"] == "top_k"
    assert_still_serving(served)


# --- 8. values the sampler cannot carry out ------------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "says"), [
    ("repetition_penalty", 1e-300, "greater than or equal to 0.01"),  # 0 in float32: logit / 0
    ("repetition_penalty", 1e-40, "greater than or equal to 0.01"),
    ("repetition_penalty", 1e308, "less than or equal to 100"),
    ("top_k", 2**31, "less than or equal to 2147483647"),
    ("stop", ["x"] * 33, "at most 32 items"),
    ("stop", "y" * 257, "at most 256 characters"),
    ("stop", ["y" * 257], "at most 256 characters"),
])
def test_values_past_what_the_sampler_holds_are_400_naming_the_field(served, field, value, says):
    r = _post(served, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] in (field, f"{field}[0]") and says in err["message"], err
    assert_still_serving(served)
