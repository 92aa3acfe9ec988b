"""The OpenAI-compatible server, checked with the official `openai` client, with the engine on a
thread of the server's process and in a process of its own.

The engine runs a deterministic executor whose tokens depend only on the prompt and position, so
streamed and non-streamed answers to the same prompt must be identical.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

from runtime.serving.async_engine import EngineOverloaded, SlowClient, merge_deltas
from runtime.serving.llm_engine import OutputDelta
from tests.test_server_harness import MODES, make_engine, make_gate, serve, wait_idle, wait_until
from traces.params import SamplingParams


@pytest.fixture(scope="module", params=MODES)
def served(request, smollm2_tokenizer):
    with serve(smollm2_tokenizer, name="smollm2", mode=request.param) as s:
        yield s.engine, s.http, s.client


def test_completion_stream_equals_non_stream(served, smollm2_tokenizer):
    engine, _, client = served
    full = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=24)
    choice = full.choices[0]
    assert choice.finish_reason == "length" and full.usage.completion_tokens == 24
    assert full.usage.prompt_tokens == len(smollm2_tokenizer("The capital of France is")["input_ids"])
    chunks = list(client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=24,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text and choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    wait_idle(engine)


def test_chat_stream_and_non_stream(served):
    engine, _, client = served
    msgs = [{"role": "user", "content": "Say hello in three languages."}]
    full = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=16)
    assert full.choices[0].message.role == "assistant" and full.object == "chat.completion"
    stream = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True})
    parts, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
    assert "".join(parts) == full.choices[0].message.content
    assert usage.completion_tokens == full.usage.completion_tokens == 16
    wait_idle(engine)


def test_n_choices_and_token_prompts(served):
    engine, _, client = served
    out = client.completions.create(model="smollm2", prompt=[[10, 11, 12], [13, 14]], max_tokens=5, n=2)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 20 and out.usage.prompt_tokens == 5
    wait_idle(engine)


def test_stop_string_cuts_the_text(served):
    engine, _, client = served
    text = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=40).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    cut = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=40, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    streamed = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=40, stop=[stop],
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text
    wait_idle(engine)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [999999]}, "outside the vocabulary"),
        ({"extra_body": {"bogus_field": 1}}, "bogus_field"),
        ({"max_tokens": 5000}, "max_model_len"),
    ],
)
def test_bad_requests_get_400_with_an_openai_error_body(served, kwargs, needle):
    engine, _, client = served
    args = {"model": "smollm2", "prompt": "hi", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**args)
    assert needle in err.value.message and err.value.body["type"] == "invalid_request_error"
    wait_idle(engine)


def test_unknown_model_is_404(served):
    _, _, client = served
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-5", prompt="hi", max_tokens=2)


@pytest.mark.parametrize("mode", MODES)
def test_client_disconnect_aborts_and_frees_kv(smollm2_tokenizer, mode):
    # 900 tokens take ~18 s: the hang-up comes first
    with serve(smollm2_tokenizer, mode=mode, delay=0.02) as s:
        body = {"model": "m", "prompt": "tell me a long story", "max_tokens": 900, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    break  # read one event, then hang up
        wait_until(lambda: s.engine.stats.client_aborts == 1, what="the abort")
        wait_idle(s.engine)  # and its KV is free (the gauges of the engine's last message)
        assert s.engine.stats.requests_finished == {}


def test_health_models_and_metrics(served):
    _, http, client = served
    assert httpx.get(http.url + "/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    text = httpx.get(http.url + "/metrics").text
    for name in ("minivllm_generation_tokens_total", "minivllm_kv_blocks_used", "minivllm_client_aborts_total",
                 "minivllm_time_to_first_token_seconds_bucket", "minivllm_slow_client_cancellations_total"):
        assert name in text


@pytest.mark.parametrize("mode", MODES)
def test_queue_full_is_429(smollm2_tokenizer, mode):
    with serve(smollm2_tokenizer, mode=mode, gate=True, max_pending=1) as s:
        body = {"model": "m", "prompt": "hi", "max_tokens": 2}
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            httpx.post(s.url + "/v1/completions", json=body, timeout=20).status_code)) for _ in range(4)]
        threads[0].start()  # taken in by the (blocked) engine
        wait_until(lambda: s.engine.state.adds_taken == 1, what="the first request taken in")
        threads[1].start()  # fills the queue
        wait_until(lambda: s.engine._adds_sent == 2, what="the second request queued")
        for t in threads[2:]:
            t.start()
        wait_until(lambda: s.engine.rejected_overloaded == 2, what="the other two refused")
        s.gate.set()
        for t in threads:
            t.join()
        assert sorted(results) == [200, 200, 429, 429]
        wait_idle(s.engine)


@pytest.mark.parametrize("mode", MODES)
def test_slow_consumer_is_aborted_without_leaking(smollm2_tokenizer, mode):
    # 10 ms steps: the 200 tokens take longer than the abort needs to reach the engine
    engine = make_engine(smollm2_tokenizer, mode, output_queue_size=2, delay=0.01)
    engine.start()

    async def run():
        stream = engine.submit([5, 6, 7], SamplingParams(max_tokens=200, ignore_eos=True))
        # don't read until the engine has aborted it: it produces far more than 2 items (waited for by
        # the abort itself, not by a fixed time a loaded machine may not get the engine started in)
        deadline = time.monotonic() + 120
        while engine.stats.slow_client_aborts < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        with pytest.raises(SlowClient):
            async for _ in stream:
                pass

    try:
        asyncio.run(run())
        assert engine.stats.slow_client_aborts == 1
        wait_idle(engine)
    finally:
        engine.shutdown()


def test_a_consumer_that_fell_behind_gets_the_waiting_deltas_merged(smollm2_tokenizer):
    engine = make_engine(smollm2_tokenizer, "thread", delay=0.002)
    engine.start()
    params = SamplingParams(max_tokens=60, ignore_eos=True)

    async def read(lag: float) -> list:
        stream = engine.submit([5, 6, 7], params)
        await asyncio.sleep(lag)  # steps run on while nobody reads
        return [d async for d in stream]

    try:
        prompt_reader = asyncio.run(read(0.0))
        late_reader = asyncio.run(read(0.3))
        wait_idle(engine)
    finally:
        engine.shutdown()
    assert len(late_reader) < len(prompt_reader) / 2  # fewer, larger items
    for got in (prompt_reader, late_reader):
        assert sum((d.token_ids for d in got), []) == sum((d.token_ids for d in prompt_reader), [])
        assert "".join(d.text for d in got) == "".join(d.text for d in prompt_reader)
        assert [d.finish_reason for d in got].count("length") == 1 and got[-1].finish_reason == "length"
        assert got[-1].num_output_tokens == 60


def test_merge_deltas_keeps_every_token_and_logprob_and_the_last_state():
    deltas = [OutputDelta(7, t, [i], None, 3, i + 1, [{i: -0.5}]) for i, t in enumerate(["a", "", "bc"])]
    deltas.append(OutputDelta(7, "d", [3], "stop", 3, 4, [{3: -1.0}], first_token_time=1.5))
    merged = merge_deltas(deltas)
    assert (merged.text, merged.token_ids, merged.finish_reason, merged.num_output_tokens) == ("abcd", [0, 1, 2, 3],
                                                                                                "stop", 4)
    assert merged.logprobs == [{0: -0.5}, {1: -0.5}, {2: -0.5}, {3: -1.0}] and merged.first_token_time == 1.5
    assert merge_deltas(deltas[:1]) is deltas[0]


@pytest.mark.parametrize("mode", MODES)
def test_overloaded_raised_before_streaming(smollm2_tokenizer, mode):
    gate = make_gate(mode)
    engine = make_engine(smollm2_tokenizer, mode, gate=gate, max_pending=1)
    engine.start()

    async def run():
        first = engine.submit([5, 6], SamplingParams(max_tokens=2))
        while engine.state.adds_taken < 1:  # the engine took it in and is stuck in its step
            await asyncio.sleep(0.01)
        engine.submit([5, 6], SamplingParams(max_tokens=2))
        with pytest.raises(EngineOverloaded):
            engine.submit([5, 6], SamplingParams(max_tokens=2))
        gate.set()
        assert [d async for d in first][-1].finish_reason == "length"

    try:
        asyncio.run(run())
    finally:
        gate.set()
        engine.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_a_burst_of_concurrent_requests(smollm2_tokenizer, mode):
    """64 clients at once, half streaming: every answer whole and equal to its twin's, nothing leaked."""
    with serve(smollm2_tokenizer, mode=mode, max_pending=256) as s:
        prompts = [f"request number {i % 16}" for i in range(64)]
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            if i % 2:
                chunks = s.client.completions.create(model="m", prompt=prompts[i], max_tokens=12, stream=True)
                answers[i] = "".join(c.choices[0].text for c in chunks)
            else:
                answers[i] = s.client.completions.create(model="m", prompt=prompts[i], max_tokens=12).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(answers) == 64
        for i in range(16):  # the same prompt, streamed or not, gives the same text
            assert len({answers[j] for j in range(i, 64, 16)}) == 1
        wait_idle(s.engine)
        assert s.engine.stats.requests_finished == {"length": 64}
