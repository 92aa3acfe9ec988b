"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis: valid and
invalid bodies, a fixed seed, a bounded number of examples) against a live server with the fake
executor and the real SmolLM2 tokenizer, recording its log. No answer may be a 5xx, every error
is an OpenAI error body, and afterwards the server still serves with no KV block held."""

from __future__ import annotations

import pytest

from tests.test_server_harness import assert_still_serving, serve, wait_idle

schemathesis = pytest.importorskip("schemathesis")  # the dev extra

MAX_EXAMPLES = 40  # per operation and phase: ~40 s on a shared 2-core CPU

schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module")
def fuzzed(smollm2_tokenizer, tmp_path_factory):
    # a short context keeps generated max_tokens cheap; the log checks what the engine accepted is
    # writable; the engine in its own process, as `minivllm serve` runs it
    log = tmp_path_factory.mktemp("fuzz") / "fuzz.jsonl"
    with serve(smollm2_tokenizer, max_model_len=192, max_pending=256, log=log, max_request_bytes=1 << 20,
               mode="process") as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(fuzzed):
    config = schemathesis.Config.from_dict({
        "seed": 0,
        "base-url": fuzzed.url,
        "request-timeout": 60,
        "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
        "phases": {"stateful": {"enabled": False}},  # examples, boundary values (coverage), then fuzzing
    })
    return schemathesis.openapi.from_dict(fuzzed.app.openapi(), config=config)


@schema.parametrize()
def test_no_5xx_and_errors_are_openai_bodies(case, fuzzed):
    response = case.call(timeout=60)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    if response.status_code >= 400 and case.path.startswith("/v1"):
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text[:500]


def test_after_the_fuzz_the_server_serves_and_holds_no_kv(fuzzed):
    assert fuzzed.engine.alive
    wait_idle(fuzzed.engine)  # no KV block held
    assert_still_serving(fuzzed)
    fuzzed.events()  # the log reads back
