"""Request bodies take OpenAI's types and nothing else: a boolean is not a number, a string is not an
integer or a boolean, and an unknown key is refused at every level as at the top; each refusal is
a 400 naming the field. With an API key every path but the probes and the scrape needs it, and a
401 names the Bearer scheme."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.test_server_harness import assert_still_serving, serve

KEY = "sk-strict-0c7d"
MESSAGES = [{"role": "user", "content": "hi"}]
BASES = {"/v1/completions": {"prompt": "hi", "max_tokens": 2},
         "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 2}}


@pytest.fixture(scope="module")
def served(smollm2_tokenizer):
    with serve(smollm2_tokenizer) as s:
        yield s


def _refused(served, path: str, body: dict) -> dict:
    r = httpx.post(served.url + path, json=body, timeout=30)
    assert r.status_code == 400, (body, r.text)
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize("path", sorted(BASES))
@pytest.mark.parametrize(("field", "value"), [
    ("temperature", True), ("top_p", False), ("max_tokens", True), ("n", True), ("seed", "7"), ("seed", True),
    ("stream", "true"), ("stream", 1), ("top_k", "5"), ("priority", True), ("ignore_eos", "false"),
    ("max_tokens", 2.0), ("stop_token_ids", [True]),
])
def test_a_value_of_the_wrong_type_is_a_400_naming_the_field(served, path, field, value):
    err = _refused(served, path, {**BASES[path], field: value})
    assert err["param"].split("[")[0] == field, err


def test_completion_only_and_chat_only_fields_are_strict_too(served):
    assert _refused(served, "/v1/completions", {**BASES["/v1/completions"], "logprobs": True})["param"] == "logprobs"
    assert _refused(served, "/v1/completions", {**BASES["/v1/completions"], "echo": 0})["param"] == "echo"
    assert _refused(served, "/v1/completions", {**BASES["/v1/completions"], "best_of": True})["param"] == "best_of"
    assert _refused(served, "/v1/completions", {"prompt": [True, 2], "max_tokens": 2})["param"].startswith("prompt")
    chat = BASES["/v1/chat/completions"]
    assert _refused(served, "/v1/chat/completions", {**chat, "logprobs": 1})["param"] == "logprobs"
    assert _refused(served, "/v1/chat/completions", {**chat, "max_completion_tokens": "3"})["param"] == \
        "max_completion_tokens"
    assert_still_serving(served)


@pytest.mark.parametrize("path", sorted(BASES))
def test_unknown_keys_are_refused_inside_stream_options(served, path):
    err = _refused(served, path, {**BASES[path], "stream": True, "stream_options": {"include_usage": True,
                                                                                     "bogus": 1}})
    assert err["param"] == "stream_options.bogus" and "unknown field" in err["message"]
    err = _refused(served, path, {**BASES[path], "stream": True, "stream_options": {"include_usage": "yes"}})
    assert err["param"] == "stream_options.include_usage"


def test_unknown_keys_are_refused_inside_messages_and_text_parts(served):
    err = _refused(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "bogus": 1}]})
    assert err["param"] == "messages[0].bogus"
    part = {"type": "text", "text": "hi", "bogus": 1}
    err = _refused(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": [part]}]})
    assert err["param"] == "messages[0].content[0].bogus"
    err = _refused(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "name": 5}]})
    assert err["param"] == "messages[0].name"
    assert_still_serving(served)


def test_what_openai_clients_send_is_still_accepted(served):
    """The official client's own requests, with OpenAI's optional message fields and stream options."""
    out = served.client.chat.completions.create(
        model="m", max_tokens=2, temperature=0, seed=7, n=1, stream=False,
        messages=[{"role": "system", "content": "be brief", "name": "sys"},
                  {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "u"}])
    assert out.choices[0].finish_reason in ("stop", "length")
    chunks = list(served.client.completions.create(model="m", prompt="hi", max_tokens=2, temperature=1,
                                                   stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert_still_serving(served)


# --- the API key --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(smollm2_tokenizer):
    with serve(smollm2_tokenizer, api_key=KEY) as s:
        yield s


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/v1/models", "/docs/oauth2-redirect",
                                  "/no/such/path"])
def test_every_path_but_the_probes_needs_the_key(keyed, path):
    r = httpx.get(keyed.url + path, timeout=30)
    assert r.status_code == 401, (path, r.text)
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["code"] == "invalid_api_key" and KEY not in r.text
    with_key = httpx.get(keyed.url + path, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert with_key.status_code != 401, path


def test_the_official_client_sees_the_401_as_an_authentication_error(keyed):
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    assert err.value.response.headers["www-authenticate"] == "Bearer"
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(keyed.url + path, timeout=30).status_code == 200, path
    assert_still_serving(keyed)
