"""An API key on /v1/* (probes and scrapers stay open), a per-request
``cache_salt`` reaching the engine, and no prompt text in anything the server writes or answers
with errors. (``--trace-prompts`` / ``--trace-if-exists``: tests/test_server_cli.py.)"""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from tests.test_server_harness import MODES, TokenizerProxy, assert_still_serving, serve, wait_idle
from traces.events import Arrived

KEY = "sk-test-5f1e"
SECRET = "marmalade-octopus-93"


@pytest.fixture(scope="module", params=MODES)
def keyed(request, smollm2_tokenizer):
    with serve(smollm2_tokenizer, api_key=KEY, mode=request.param) as s:
        yield s


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": KEY},
                                     {"authorization": f"Basic {KEY}"}])
def test_v1_needs_the_bearer_key(keyed, headers):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        r = httpx.request(method, keyed.url + path, headers=headers, json={"prompt": "hi"}, timeout=30)
        assert r.status_code == 401, (path, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and KEY not in r.text
    assert_still_serving(keyed)


def test_official_client_with_a_wrong_key_gets_authentication_error(keyed):
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="m", prompt="hi", max_tokens=2)
    assert [m.id for m in keyed.client.models.list().data] == ["m"]  # the right key
    assert_still_serving(keyed)


def test_probes_and_metrics_stay_open(keyed):
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(keyed.url + path, timeout=30).status_code == 200, path
    assert_still_serving(keyed)


def test_no_key_configured_means_open(smollm2_tokenizer):
    with serve(smollm2_tokenizer) as s:
        assert httpx.get(s.url + "/v1/models", timeout=30).status_code == 200
        assert_still_serving(s)


def test_api_key_from_the_flag_or_vllms_env(monkeypatch):
    from runtime.cli.serve import resolve_api_key

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert resolve_api_key(None) is None
    assert resolve_api_key("flag") == "flag"
    monkeypatch.setenv("VLLM_API_KEY", "env")
    assert resolve_api_key(None) == "env" and resolve_api_key("flag") == "flag"


# --- cache_salt -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_cache_salt_reaches_the_engine_and_separates_prefix_caches(smollm2_tokenizer, mode, tmp_path):
    with serve(smollm2_tokenizer, log=tmp_path / "log.jsonl", mode=mode) as s:
        prompt = [9] * 48  # three full blocks

        def run(salt: str | None, chat: bool = False) -> None:
            extra = {"cache_salt": salt} if salt else {}
            if chat:
                s.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x " * 40}],
                                                 max_tokens=1, extra_body=extra)
            else:
                s.client.completions.create(model="m", prompt=prompt, max_tokens=1, extra_body=extra)
            wait_idle(s.engine)

        hits = lambda: s.engine.stats.prefix_hit_tokens  # noqa: E731
        run("tenant-a")
        before = hits()
        run("tenant-b")  # same prompt, another tenant: nothing shared
        assert hits() == before
        run("tenant-a")  # same tenant: its prefix is reused
        assert hits() > before
        run("tenant-a", chat=True)
        salts = [e.cache_salt for e in s.events() if isinstance(e, Arrived)]
        assert salts == ["tenant-a", "tenant-b", "tenant-a", "tenant-a"]
        for bad in ("", 5):
            with pytest.raises(openai.BadRequestError) as err:
                s.client.completions.create(model="m", prompt="hi", max_tokens=1, extra_body={"cache_salt": bad})
            assert err.value.body["param"] == "cache_salt"
        r = httpx.post(s.url + "/v1/completions", headers={"content-type": "application/json"}, timeout=30,
                       content=b'{"prompt": "hi", "cache_salt": "\\ud800"}')
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
        assert_still_serving(s)


# --- no prompt text in logs or error messages ------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_no_prompt_text_in_logs_or_errors(smollm2_tokenizer, caplog, capfd, mode):
    proxy = TokenizerProxy(smollm2_tokenizer)
    bodies = []
    with caplog.at_level(logging.DEBUG), serve(smollm2_tokenizer, app_tokenizer=proxy, mode=mode,
                                                  max_request_bytes=256 << 10) as s:
        def post(path: str, body: dict | bytes) -> None:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = httpx.post(s.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
            bodies.append(r.text)

        user = {"role": "user", "content": f"my secret is {SECRET}"}
        post("/v1/completions", {"prompt": f"{SECRET} " * 2000, "max_tokens": 1})  # too long, tokenized
        post("/v1/completions", {"prompt": SECRET * 10_000, "max_tokens": 1})  # too long, by characters
        post("/v1/completions", {"prompt": f"{SECRET}", "max_tokens": 5000})  # max_tokens too big
        post("/v1/completions", {"prompt": f"{SECRET}", "temperature": float("nan")})
        post("/v1/completions", {"prompt": [1, 2, 10 ** 9], "max_tokens": 1})  # a bad token id
        post("/v1/completions", {"prompt": f"{SECRET}", "stop": [""]})
        post("/v1/completions", {"prompt": {"text": SECRET}})  # wrong type
        post("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": SECRET}]}]})
        post("/v1/chat/completions", {"messages": [{"role": SECRET, "content": "hi"}]})
        post("/v1/chat/completions", {"messages": [user], "bogus": SECRET})
        post("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "{SECRET}'.encode())  # cut short
        post("/v1/completions", {"prompt": SECRET, "max_tokens": 2, "model": SECRET})  # unknown model
        proxy.fail_encode = True  # an unexpected error whose message quotes the prompt
        post("/v1/completions", {"prompt": SECRET, "max_tokens": 2})
        post("/v1/chat/completions", {"messages": [user], "max_tokens": 2})
        proxy.fail_encode = False
        post("/v1/completions", {"prompt": SECRET, "max_tokens": 2})  # and a good one
        assert_still_serving(s)
    out, err = capfd.readouterr()
    assert all(SECRET not in b for b in bodies), [b for b in bodies if SECRET in b]
    assert SECRET not in caplog.text and SECRET not in out and SECRET not in err
    assert sum('"error"' in b for b in bodies) == len(bodies) - 1
