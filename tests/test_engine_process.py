"""The engine in a process of its own (runtime/serving/engine_process.py): the same answers and,
times aside, the same event log as the engine on a thread of the server; the HTTP process never
loads torch; and no exit path leaves an orphan or a hang — the front end killed, stopped with
SIGTERM or SIGINT, the engine killed or failing in a step (then `minivllm serve` exits non-zero)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import httpx
import pytest

from runtime.bench.server_process import ServerProcess
from runtime.cli import build_parser
from runtime.cli.serve import build_app
from runtime.serving.server.launch import ServerThread, free_port
from tests.model_helpers import make_tiny
from tests.proc_helpers import engine_child, running
from tests.test_server_fakes import Exploding, exploding_llm_engine
from tests.test_server_harness import serve, wait_until
from traces.log import read_log
from traces.request_names import RUN_ID_KEY

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TINY_FLAGS = ["--device", "cpu", "--block-size", "4", "--num-blocks", "64", "--max-model-len", "128"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("engine_process"), tokenizer=True)


# --- the same log ----------------------------------------------------------------------------------


def _requests(first_text: str) -> list[tuple[str, dict]]:
    """One at a time, each to its end (so the steps are the same: n > 1 or a prompt list would
    race its own siblings into the engine): every kind of request the log records."""
    stop = first_text[len(first_text) // 2:][:2]  # cuts the same greedy text, in the step it appears
    return [
        ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0, "stop": [stop]}),
        ("/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 6, "ignore_eos": True, "temperature": 0.9,
                             "seed": 3, "logprobs": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello world!"}], "max_tokens": 10,
                                  "temperature": 0.7, "top_p": 0.9, "seed": 7, "cache_salt": "t1"}),
        ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 5, "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}}),
    ]


def _serve_and_record(tiny, log: Path, *flags: str) -> list:
    args = build_parser().parse_args(["serve", "--model", str(tiny.folder), *TINY_FLAGS, "--trace", str(log),
                                      "--trace-if-exists", "overwrite", *flags])
    app, _, close = build_app(args)
    answers = []
    try:
        with ServerThread(app) as http:
            greedy = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
            first = httpx.post(http.url + "/v1/completions", json=greedy, timeout=60).json()
            answers.append(first["choices"])
            for path, body in _requests(first["choices"][0]["text"]):
                r = httpx.post(http.url + path, json=body, timeout=60)
                assert r.status_code == 200, r.text
                if body.get("stream"):
                    answers.append(_joined([json.loads(line[5:])["choices"] for line in r.text.splitlines()
                                            if line.startswith("data:") and "[DONE]" not in line]))
                else:
                    answers.append(r.json()["choices"])
    finally:
        close()
    return answers


def _joined(events: list[list[dict]]) -> list[dict]:
    """A stream's choices, each choice's deltas joined: how deltas group into events follows how
    fast the client reads (a lagging reader gets them merged), which is not what is compared."""
    out: dict[int, dict] = {}
    for choices in events:
        for c in choices:
            joined = out.setdefault(c["index"], {"index": c["index"], "text": "", "finish_reason": None})
            joined["text"] += c.get("text") or ""
            joined["finish_reason"] = c.get("finish_reason") or joined["finish_reason"]
    return [out[i] for i in sorted(out)]


def _untimed(path: Path) -> list[dict]:
    """The log's events, less their times and the run's name (every run has its own)."""
    return [{f: _unnamed(getattr(e, f)) if f == "extra" else getattr(e, f) for f in e.__struct_fields__
             if f not in ("time", "start", "end")} for e in read_log(path)]


def _unnamed(extra: dict) -> dict:
    return {k: v for k, v in extra.items() if k != RUN_ID_KEY}


def test_the_engine_process_writes_the_log_the_engine_thread_does(tiny, tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the child's torch: as many threads as ours
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = _serve_and_record(tiny, tmp_path / "thread.jsonl", "--no-engine-process")
    finally:
        torch.set_num_threads(threads)
    there = _serve_and_record(tiny, tmp_path / "process.jsonl")  # the default
    assert here == there
    assert any(c["finish_reason"] == "stop" for c in here[1])  # the stop string was hit
    thread_log, process_log = _untimed(tmp_path / "thread.jsonl"), _untimed(tmp_path / "process.jsonl")
    assert len(thread_log) > 20 and thread_log == process_log


def test_a_start_up_error_is_the_cli_error_it_was(tiny, tmp_path):
    args = build_parser().parse_args(["serve", "--model", str(tmp_path / "nowhere"), *TINY_FLAGS])
    with pytest.raises(ValueError, match="no such model"):
        build_app(args)


# --- processes ---------------------------------------------------------------------------------------


def _maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def _launch(tiny, tmp_path: Path) -> ServerProcess:
    server = ServerProcess(["--model", str(tiny.folder), *TINY_FLAGS], port=free_port(),
                           trace=str(tmp_path / "live.jsonl"), log_file=str(tmp_path / "server.out"))
    server.wait_ready(120)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200
    return server


def _log_is_whole(path: Path) -> None:
    reader = read_log(path)
    events = list(reader)
    assert not reader.truncated and type(events[0]).__name__ == "Header"
    assert any(type(e).__name__ == "Finished" for e in events)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_server_and_its_engine_with_the_log_closed(tiny, tmp_path, sig):
    server = _launch(tiny, tmp_path)
    try:
        engine = engine_child(server.proc.pid)
        assert _maps_torch(engine) and not _maps_torch(server.proc.pid)  # torch lives in the engine only
        server.proc.send_signal(sig)
        assert server.proc.wait(30) in ((0,) if sig == signal.SIGTERM else (0, 130))  # 130: as Ctrl-C
        wait_until(lambda: not running(engine), 10, "the engine process to exit")
    finally:
        server.stop()
    _log_is_whole(tmp_path / "live.jsonl")
    assert "Traceback" not in (tmp_path / "server.out").read_text()


def test_a_killed_front_end_leaves_no_engine_behind(tiny, tmp_path):
    server = _launch(tiny, tmp_path)
    try:
        engine = engine_child(server.proc.pid)
        server.proc.kill()
        server.proc.wait(10)
        wait_until(lambda: not running(engine), 15, "the orphaned engine to exit")
    finally:
        server.stop()
    _log_is_whole(tmp_path / "live.jsonl")  # it stopped cleanly: its log flushed and closed


def test_the_server_exits_when_its_engine_dies(tiny, tmp_path):
    """The policy: no 503 forever, but an exit a supervisor sees (and restarts the server on)."""
    from runtime.cli.serve import ENGINE_DIED_STATUS

    server = _launch(tiny, tmp_path)
    try:
        os.kill(engine_child(server.proc.pid), signal.SIGKILL)
        assert server.proc.wait(60) == ENGINE_DIED_STATUS
    finally:
        server.stop()
    out = (tmp_path / "server.out").read_text()
    assert "engine process exited" in out and "shutting down" in out and "Traceback" not in out


def _stream_until_error(url: str, result: dict, started: threading.Event) -> None:
    body = {"model": "m", "prompt": "tell me a long story", "max_tokens": 900, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        data = []
        for line in r.iter_lines():
            if line.startswith("data:"):
                data.append(line[5:].strip())
                started.set()
    result["data"] = data


def _assert_engine_gone(s) -> None:
    assert httpx.get(s.url + "/health").status_code == 503
    assert httpx.get(s.url + "/ready").status_code == 503
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
    assert "minivllm_engine_alive 0.0" in httpx.get(s.url + "/metrics").text


def test_a_killed_engine_ends_every_stream_and_fails_health(smollm2_tokenizer):
    with serve(smollm2_tokenizer, mode="process", delay=0.02) as s:  # 900 tokens: ~18 s
        result, started = {}, threading.Event()
        client = threading.Thread(target=_stream_until_error, args=(s.url, result, started))
        client.start()
        assert started.wait(30)
        os.kill(s.engine.connection.proc.pid, signal.SIGKILL)
        client.join(15)
        assert not client.is_alive(), "the stream hung"
        data = result["data"]
        assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "engine_dead"
        _assert_engine_gone(s)


def test_an_engine_failing_in_a_step_ends_every_stream_and_exits(smollm2_tokenizer, capfd):
    from runtime.serving.async_engine import AsyncLLMEngine
    from runtime.serving.engine_main import EngineSpec
    from runtime.serving.engine_process import EngineProcess
    from runtime.serving.server.app import create_app

    process = EngineProcess(EngineSpec(exploding_llm_engine, {"tokenizer": smollm2_tokenizer}, warmup=False))
    engine = AsyncLLMEngine(connection=process)
    engine.start()
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http:
            r = httpx.post(http.url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 3}, timeout=30)
            assert r.status_code == 200
            r = httpx.post(http.url + "/v1/completions", json={"prompt": [99, 5], "max_tokens": 3}, timeout=30)
            assert r.status_code == 503 and "RuntimeError" in r.json()["error"]["message"]
            # not proc.join(): the connection's thread polls the same process, and a join that loses the
            # waitpid race to it returns before exitcode is set; a loaded CI machine can take long
            wait_until(lambda: process.proc.exitcode is not None, 90, "the engine process to exit")
            assert process.proc.exitcode == 1, f"engine process exit code {process.proc.exitcode}"
            _assert_engine_gone(type("S", (), {"url": http.url}))
    finally:
        engine.shutdown()
    err = capfd.readouterr().err
    assert "unhandled RuntimeError" in err and Exploding.secret not in err
