"""A chat request that cannot fit the context is refused before its template is rendered: its
messages' template markers and text bound its tokens from below, checked on the raw body's message
count before the body is parsed, and on every message's role and text before the template. The bound
is a bound: it never exceeds what the template makes."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.serving.server.prompts import ROLES, ChatSize, max_chars_per_token, raw_items, raw_members, raw_value
from tests.test_server_harness import TokenizerProxy, assert_still_serving, serve

MANY = 240_000  # one-character messages: 8 MB, under the body limit


@pytest.fixture(scope="module")
def counted(smollm2_tokenizer):
    proxy = TokenizerProxy(smollm2_tokenizer)
    with serve(smollm2_tokenizer, app_tokenizer=proxy, max_request_bytes=16 << 20) as s:
        yield s, proxy


def test_a_quarter_million_tiny_messages_are_refused_without_rendering_the_template(counted):
    served, proxy = counted
    body = json.dumps({"model": "m", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "x"}] * MANY}).encode()
    renders = proxy.encode_calls
    with httpx.Client(timeout=120) as client:
        cpu, wall = time.process_time(), time.perf_counter()
        r = client.post(served.url + "/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"})
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and f"{MANY} messages" in err["message"] and "max_model_len" in err["message"]
    assert proxy.encode_calls == renders  # neither templated nor tokenized
    # this process runs the server and the client: the whole exchange's CPU, parse included (the
    # template alone took tens of seconds); a bound that load on the machine cannot break
    assert cpu < 1.0, (cpu, wall)
    assert_still_serving(served)


def test_long_messages_of_every_role_are_refused_before_the_template(counted):
    served, proxy = counted
    renders = proxy.encode_calls
    messages = [{"role": role, "content": "word " * 40} for role in ROLES] * 60  # fewer messages, more text
    r = httpx.post(served.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert proxy.encode_calls == renders
    assert_still_serving(served)


def test_a_chat_that_fits_is_rendered_once(counted):
    served, proxy = counted
    renders = proxy.encode_calls
    out = served.client.chat.completions.create(model="m", max_tokens=2,
                                                messages=[{"role": "user", "content": "hi"}] * 20)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert proxy.encode_calls == renders + 1
    assert_still_serving(served)


def test_more_prompts_than_the_queue_holds_are_refused_on_the_raw_body(counted):
    served, proxy = counted
    renders = proxy.encode_calls
    r = httpx.post(served.url + "/v1/completions", json={"prompt": [[5]] * 200_000, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "max_pending" in r.text
    assert proxy.encode_calls == renders
    assert_still_serving(served)


MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(ROLES),
    "content": st.lists(st.sampled_from(["a", " ", "\n", "hello", "é", "<", "|", "<|im_end|>", "#" * 40, "日本"]),
                        max_size=30).map("".join)})


@pytest.fixture(scope="module")
def size(smollm2_tokenizer) -> ChatSize:
    return ChatSize(smollm2_tokenizer, max_chars_per_token(smollm2_tokenizer))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(messages=st.lists(MESSAGE, min_size=1, max_size=8))
def test_the_bound_never_exceeds_what_the_template_makes(smollm2_tokenizer, size, messages):
    ids = smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    kept = [(m["role"], 0 if m["role"] == "assistant" else len(m["content"])) for m in messages]
    assert size.at_least(len(messages)) <= size.of(kept) <= len(ids)
    assert size.min_marker_tokens >= 1  # SmolLM2's markers are added tokens: each message costs them


class _TooMany(Exception):
    pass


def _refuse_over_three_messages(top):
    """A precheck of the raw body's members: more than three messages is too many."""
    if len(raw_items(top["messages"])) > 3:
        raise _TooMany


def test_the_counts_are_checked_before_the_body_is_parsed(monkeypatch):
    from runtime.serving.server import intake
    from runtime.serving.server.protocol import ChatCompletionRequest

    def never(*_):
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(intake.json, "loads", never)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}] * 4}).encode()
    with pytest.raises(_TooMany):
        intake.parse_body(ChatCompletionRequest, body, "application/json", _refuse_over_three_messages)


def test_the_raw_body_is_read_as_json_reads_it():
    data = b'{"n": 2, "prompt": [ "a", [1, 2], {"x": "]"} ], "prompt": ["b"], "messages": "no"}'
    top = raw_members(data)
    assert sorted(top) == ["messages", "n", "prompt"]
    assert [json.loads(bytes(i)) for i in raw_items(top["prompt"])] == json.loads(data)["prompt"]
    assert raw_value(top["n"]) == 2 and raw_value(top.get("seed")) is None
    assert raw_items(top["messages"]) is None and raw_items(None) is None
    for not_an_object in (b"[1]", b'{"a": 1', b"", b'"x"', b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"):
        assert raw_members(not_an_object) is None
    assert raw_value(raw_members(b'{"n": 1e400}')["n"]) is None  # past float range: the body model's 400


@pytest.mark.parametrize("odd", ["bom", "nan"])
def test_json_that_only_json_loads_reads_is_counted_too(monkeypatch, odd):
    from runtime.serving.server import intake
    from runtime.serving.server.protocol import ChatCompletionRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 4}
    data = json.dumps(body | ({"top_p": float("nan")} if odd == "nan" else {})).encode()
    data = b"\xef\xbb\xbf" + data if odd == "bom" else data
    assert raw_members(data) is None
    with pytest.raises(_TooMany):
        intake.parse_body(ChatCompletionRequest, data, "application/json", _refuse_over_three_messages)


def test_bench_serve_s_oversized_requests_are_refused_and_reported(counted):
    from runtime.bench.oversized_requests import MESSAGES, OversizedRequests

    served, proxy = counted
    renders = proxy.encode_calls
    with OversizedRequests(served.url + "/v1", "m", rate=20) as sender:
        deadline = time.monotonic() + 60
        while not sender.report().sent and time.monotonic() < deadline:
            time.sleep(0.1)
    report = sender.report()
    assert report.sent >= 1 and report.answers == {"400": report.sent}, report
    assert report.latency_p50_ms <= report.latency_p99_ms
    assert f"{MESSAGES:,} chat messages each, 20/s): {report.sent:,} sent: {report.sent:,} × 400" in report.render()
    assert proxy.encode_calls == renders
    assert_still_serving(served)
