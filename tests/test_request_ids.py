"""A response's id names its request in the server's event log, checked with the official openai
client: ``cmpl-<run>-<request id>``, where the run is the one the log's Header names and the id is
the ``Arrived`` event's; the ``X-Request-Id`` header lists every choice's; every streamed chunk
carries it, from the first, even when the request's first output is an error."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.llm_engine import LLMEngine
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from tests.test_server_fakes import PromptSeededExecutor, fake_llm_engine
from tests.test_server_harness import MODES, serve, wait_idle
from traces.events import Aborted, Arrived, Header
from traces.log import read_log
from traces.request_names import header_run_id, parse_request_name


def _logged(path) -> tuple[str | None, dict[int, Arrived], list]:
    """(the run its Header names, Arrived by request id, every event)."""
    events = list(read_log(path))
    header = next(e for e in events if isinstance(e, Header))
    return header_run_id(header), {e.request_id: e for e in events if isinstance(e, Arrived)}, events


@pytest.mark.parametrize("mode", MODES)
def test_a_completions_id_names_its_request_in_the_servers_log(smollm2_tokenizer, tmp_path, mode):
    prompts = [[100 + i, 7, 8, 9 + i] for i in range(3)]
    with serve(smollm2_tokenizer, mode=mode, log=tmp_path / "server.jsonl") as s:
        outs = []
        for p in prompts:
            raw = s.client.completions.with_raw_response.create(model="m", prompt=p, max_tokens=2)
            out = raw.parse()
            assert raw.headers["x-request-id"] == out.id
            outs.append(out)
        wait_idle(s.engine)
    run, arrived, _ = _logged(tmp_path / "server.jsonl")
    assert run is not None
    for i, (p, out) in enumerate(zip(prompts, outs)):
        name = parse_request_name(out.id)
        assert out.id == f"cmpl-{run}-{i}" and name == (run, None, i)
        assert arrived[name.request_id].prompt.token_ids == p


def test_streamed_chunks_all_carry_the_id_of_their_logged_request(smollm2_tokenizer, tmp_path):
    with serve(smollm2_tokenizer, log=tmp_path / "server.jsonl") as s:
        raw = s.client.completions.with_raw_response.create(model="m", prompt=[5, 6, 7], max_tokens=4, stream=True,
                                                            stream_options={"include_usage": True})
        completion = list(raw.parse())
        completion_header = raw.headers["x-request-id"]
        raw = s.client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True)
        chat = list(raw.parse())
        chat_header = raw.headers["x-request-id"]
        wait_idle(s.engine)
    run, arrived, _ = _logged(tmp_path / "server.jsonl")
    assert completion[-1].usage is not None and len(completion) >= 2  # tokens, then usage
    assert {c.id for c in completion} == {completion_header} == {f"cmpl-{run}-0"}
    assert chat[0].choices[0].delta.role == "assistant"  # the first chunk, sent before any token
    assert {c.id for c in chat} == {chat_header} == {f"chatcmpl-{run}-1"}
    assert arrived[0].prompt.token_ids == [5, 6, 7] and sorted(arrived) == [0, 1]


@pytest.mark.parametrize("stream", [False, True])
def test_each_prompt_and_choice_is_a_logged_request_the_header_lists(smollm2_tokenizer, tmp_path, stream):
    prompts = [[11, 12, 13], [21, 22]]
    with serve(smollm2_tokenizer, log=tmp_path / "server.jsonl") as s:
        raw = s.client.completions.with_raw_response.create(model="m", prompt=prompts, n=2, max_tokens=2,
                                                            temperature=0.8, seed=3, stream=stream)
        out = raw.parse()
        ids = raw.headers["x-request-id"].split(", ")
        body_ids = {c.id for c in out} if stream else {out.id}
        wait_idle(s.engine)
    run, arrived, _ = _logged(tmp_path / "server.jsonl")
    assert body_ids == {ids[0]} and len(set(ids)) == 4  # one id per call in the body; every choice's in the header
    for index, response_id in enumerate(ids):  # choice ``index`` is prompt index // n
        name = parse_request_name(response_id)
        assert name.run_id == run and arrived[name.request_id].prompt.token_ids == prompts[index // 2]


class FailsEveryFirstToken(PromptSeededExecutor):
    """Every request's first sampled token comes from non-finite logits: the engine aborts it."""

    def execute(self, plan, requests):
        result = super().execute(plan, requests)
        failed = {s.request_id: "non-finite logits" for s in plan.spans if s.sample}
        return msgspec.structs.replace(result, failed=failed or None)

    launch = execute


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_stream_whose_first_output_is_an_error_still_names_its_request(smollm2_tokenizer, tmp_path, endpoint):
    base = fake_llm_engine(smollm2_tokenizer, log=str(tmp_path / "server.jsonl"))
    llm = LLMEngine.from_core(base.core, FailsEveryFirstToken(len(smollm2_tokenizer)), smollm2_tokenizer,
                              overlap=True, writer=base.writer, run_id=base.run_id)
    engine = AsyncLLMEngine(llm)
    engine.start()
    prompt = {"prompt": [9, 8, 7]} if endpoint == "completions" else {"messages": [{"role": "user", "content": "x"}]}
    body = {"model": "m", "max_tokens": 3, "stream": True, **prompt}
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http, \
                httpx.stream("POST", f"{http.url}/v1/{endpoint}", json=body, timeout=30) as resp:
            header = resp.headers["x-request-id"]
            events = [line[5:].strip() for line in resp.iter_lines() if line.startswith("data:")]
        wait_idle(engine)
    finally:
        engine.shutdown()
        llm.close()
    run, arrived, log = _logged(tmp_path / "server.jsonl")
    prefix = "cmpl" if endpoint == "completions" else "chatcmpl"
    assert resp.status_code == 200 and header == f"{prefix}-{run}-0" and events[-1] == "[DONE]"
    chunks = [msgspec.json.decode(e) for e in events[:-1]]
    assert "error" in chunks[-1] and all(c["id"] == header for c in chunks[:-1])  # (chat: its role chunk)
    assert len(chunks) == (1 if endpoint == "completions" else 2)
    assert list(arrived) == [0] and [e.request_id for e in log if isinstance(e, Aborted)] == [0]
