"""A large request's intake (parse, validate, template, tokenize) runs in an intake process, never
on the event loop that streams other requests' tokens (runtime/serving/server/intake.py): a
stream goes on while a large chat is being templated; what the worker answers (ids, errors) is
what the loop answers for a small body; a worker that dies costs one 503, and none outlives its
server."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from runtime.serving.server.intake import INLINE_BYTES, Intake
from tests.proc_helpers import running
from tests.test_server_harness import assert_still_serving, serve, wait_until

BIG = {"max_model_len": 16384, "num_blocks": 2048}  # room for the large prompts below


class GatedTokenizer:
    """The real tokenizer, whose chat template, once it starts, writes its process id to
    ``gate/started`` and then spins (holding the GIL, as Jinja does) until ``gate/release`` exists."""

    def __init__(self, tokenizer, gate: Path) -> None:
        self._tok, self.gate = tokenizer, str(gate)

    def __len__(self) -> int:
        return len(self._tok)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._tok, name)

    def __call__(self, *args, **kwargs):
        return self._tok(*args, **kwargs)

    def apply_chat_template(self, messages, *args, **kwargs):
        if len(messages) > 100:  # the large chat only (not the start-up's measuring renders)
            Path(self.gate, "started").write_text(str(os.getpid()))
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(self.gate, "release")) and time.monotonic() < deadline:
                sum(range(1000))  # pure Python: the GIL stays held between the interpreter's switches
        return self._tok.apply_chat_template(messages, *args, **kwargs)


def _large_chat(n: int = 400, stream: bool = False) -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} says hello"}
                for i in range(n)]
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 2, "stream": stream}).encode()
    assert len(body) >= INLINE_BYTES
    return body


def test_a_stream_goes_on_while_a_large_chat_is_templated(smollm2_tokenizer, tmp_path):
    gated = GatedTokenizer(smollm2_tokenizer, tmp_path)
    with serve(smollm2_tokenizer, app_tokenizer=gated, mode="process", delay=0.002, **BIG) as s:
        chunks: list[float] = []
        stream_done, hang_up = threading.Event(), threading.Event()

        def stream() -> None:  # (long enough to outlast a slow machine's worker start; cut short below)
            body = {"model": "m", "prompt": "hello", "max_tokens": 12000, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(time.monotonic())
                    if hang_up.is_set():
                        return
            stream_done.set()

        streamer = threading.Thread(target=stream)
        streamer.start()
        wait_until(lambda: len(chunks) >= 5, 60, "the stream to start")
        answers: list[httpx.Response] = []
        big = threading.Thread(target=lambda: answers.append(httpx.post(
            s.url + "/v1/chat/completions", content=_large_chat(), headers={"content-type": "application/json"},
            timeout=120)))
        big.start()
        started = tmp_path / "started"
        wait_until(started.exists, 60, "the large chat's template to start")
        assert int(started.read_text()) != os.getpid()  # templated in another process than the server's
        during = len(chunks)
        # while its template still runs, the stream's tokens keep coming
        wait_until(lambda: len(chunks) >= during + 20, 60, "stream tokens during the large chat's intake")
        assert not answers and not stream_done.is_set()
        (tmp_path / "release").touch()
        big.join(120)
        assert answers[0].status_code == 200, answers[0].text
        want = len(smollm2_tokenizer.apply_chat_template(json.loads(_large_chat())["messages"],
                                                         add_generation_prompt=True, tokenize=True)["input_ids"])
        assert answers[0].json()["usage"]["prompt_tokens"] == want
        assert s.app.state.server.intake.taken_in_pool == 1
        hang_up.set()
        streamer.join(120)
        assert_still_serving(s)


@pytest.fixture(scope="module")
def served(smollm2_tokenizer):
    with serve(smollm2_tokenizer, **BIG) as s:
        yield s


def _post(s, path: str, body: dict, pad: int = 0, content_type: str = "application/json") -> httpx.Response:
    """``body`` as sent, or grown past INLINE_BYTES by ``pad`` characters of ``user`` (a field
    that changes nothing), so the worker takes it in."""
    if pad:
        body = {**body, "user": "u" * pad}
    return httpx.post(s.url + path, content=json.dumps(body).encode(), headers={"content-type": content_type},
                      timeout=60)


SAME_ANSWERS = [  # (path, body): whatever takes it in, the same answer
    ("/v1/completions", {"model": "m", "prompt": "the same prompt " * 50, "max_tokens": 4, "temperature": 0}),
    ("/v1/completions", {"model": "m", "prompt": [[5, 6, 7], [8] * 300], "max_tokens": 2}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi " * 40}] * 30,
                              "max_tokens": 3}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                              "max_tokens": 1}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "temperature": True}),
    ("/v1/completions", {"model": "m", "prompt": [5, -1]}),
    ("/v1/completions", {"model": "other", "prompt": "hi"}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "robot", "content": "hi"}]}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20000}),
    ("/v1/completions", {"model": "m", "prompt": ["hi"] * 100, "n": 2}),
]


@pytest.mark.parametrize(("path", "body"), SAME_ANSWERS)
def test_a_large_body_gets_the_answer_a_small_one_gets(served, path, body):
    small, large = _post(served, path, body), _post(served, path, body, pad=INLINE_BYTES)
    assert large.status_code == small.status_code, (small.text, large.text)
    if small.status_code == 200:
        a, b = small.json(), large.json()
        assert [c.get("text", c.get("message")) for c in a["choices"]] == \
               [c.get("text", c.get("message")) for c in b["choices"]]
        assert a["usage"] == b["usage"]
    else:
        assert large.json() == small.json()  # the same field named, the same words
    assert_still_serving(served)


@pytest.mark.parametrize("content", [b"{not json" + b" " * INLINE_BYTES, b"[1, 2]" + b" " * INLINE_BYTES])
def test_a_large_body_that_is_no_request_is_a_400(served, content):
    small = httpx.post(served.url + "/v1/completions", content=content.strip(),
                       headers={"content-type": "application/json"}, timeout=60)
    large = httpx.post(served.url + "/v1/completions", content=content, headers={"content-type": "application/json"},
                       timeout=60)
    assert small.status_code == large.status_code == 400
    assert small.json()["error"]["message"] == large.json()["error"]["message"]
    assert_still_serving(served)


def test_a_large_body_that_is_not_json_typed_is_a_400(served):
    r = _post(served, "/v1/completions", {"model": "m", "prompt": "hi"}, pad=INLINE_BYTES, content_type="text/plain")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert_still_serving(served)


def test_a_dead_worker_costs_one_503_then_a_fresh_one_serves(served):
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    assert _post(served, "/v1/completions", body, pad=INLINE_BYTES).status_code == 200
    intake: Intake = served.app.state.server.intake
    (pid,) = list(intake._pool._processes)
    os.kill(pid, 9)
    statuses = []
    for _ in range(5):
        r = _post(served, "/v1/completions", body, pad=INLINE_BYTES)
        statuses.append(r.status_code)
        if r.status_code == 200:
            break
        assert r.status_code == 503 and r.json()["error"]["code"] == "intake_worker_died", r.text
    assert statuses[-1] == 200 and statuses.count(503) <= 1, statuses
    assert_still_serving(served)


def test_no_worker_outlives_its_server(smollm2_tokenizer):
    with serve(smollm2_tokenizer, **BIG) as s:
        assert _post(s, "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 1},
                     pad=INLINE_BYTES).status_code == 200
        pids = list(s.app.state.server.intake._pool._processes)
        assert pids
    wait_until(lambda: not any(running(p) for p in pids), 30, "the intake workers to exit")


def test_a_body_cut_off_mid_way_is_no_server_error(served, caplog):
    import socket

    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n" + b'{"prompt": "' + b"a" * 20000)
        time.sleep(0.2)
    time.sleep(0.5)
    assert_still_serving(served)
    assert not [r for r in caplog.records if "unhandled" in r.getMessage()]


def test_large_requests_past_the_pending_bound_are_refused_at_once(served):
    """As many large requests as the workers may hold are pending: the next gets a 429 naming the
    cause, without waiting; once one is answered, large requests are taken in again."""
    intake: Intake = served.app.state.server.intake
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    held, intake.pending = intake.pending, intake.max_pending  # (as if that many were being taken in)
    try:
        refused = _post(served, "/v1/completions", body, pad=INLINE_BYTES)
    finally:
        intake.pending = held
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "intake_busy"
    assert intake.refused_busy >= 1
    assert _post(served, "/v1/completions", body, pad=INLINE_BYTES).status_code == 200
    assert intake.pending == held
    assert_still_serving(served)


def test_a_closed_intake_starts_no_worker(caplog):
    """A front end stopping before its intake worker has started: the start that comes after the
    close makes no pool (one started then would outlive the process's exit, its worker mid-spawn,
    and print a traceback), and says nothing."""
    intake = Intake(prompts=None, tokenizer=None, model_name="m")
    intake.close()
    with pytest.raises(RuntimeError, match="stopping"):
        intake._get_pool()
    before = set(threading.enumerate())
    intake.start()
    for thread in set(threading.enumerate()) - before:
        thread.join(10)
    assert intake._pool is None and "did not start" not in caplog.text


def test_serve_starts_every_worker_before_it_is_ready(served):
    """``start`` (what ``minivllm serve`` calls) spawns each worker and has it answer before ``up``:
    the first large requests after start-up wait for no process to import its modules."""
    taken = served.app.state.server.intake
    intake = Intake(taken.prompts, taken.tokenizer, "m", workers=2)
    try:
        intake.start()
        assert not intake.up.is_set()
        wait_until(intake.up.is_set, 120, "the intake workers to start")
        assert len(intake.worker_pids) == 2 and intake.worker_pids == set(intake._pool._processes)
    finally:
        intake.close()


def test_ready_waits_for_the_intake_workers(served):
    intake: Intake = served.app.state.server.intake
    intake.up.clear()
    try:
        r = httpx.get(served.url + "/ready", timeout=10)
        assert r.status_code == 503 and r.json() == {"status": "starting intake workers"}
    finally:
        intake.up.set()
    assert httpx.get(served.url + "/ready", timeout=10).json() == {"status": "ready"}


def test_front_end_0_is_not_ready_until_the_others_listen(served):
    """/ready says 503 while front ends 1..N-1 are still starting (``serve`` hooks them in)."""
    server = served.app.state.server
    server.others_listening = lambda: False
    try:
        r = httpx.get(served.url + "/ready", timeout=10)
        assert r.status_code == 503 and r.json() == {"status": "starting front ends"}
    finally:
        server.others_listening = lambda: True
    assert httpx.get(served.url + "/ready", timeout=10).json() == {"status": "ready"}
