"""bench serve's client against a live server (fake executor, real tokenizer) and the in-process
live runner: every request measured, arrivals kept, SLO goodput computed, errors counted by kind."""

from __future__ import annotations

import json

import pytest

from runtime.bench import serve_client
from runtime.bench.live import replay_live
from runtime.bench.serve_client import RequestRecord, Slo
from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.llm_engine import LLMEngine
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from tests.helpers import SeededTokenExecutor
from traces.events import Arrived
from traces.generators import generate


class Overlapping(SeededTokenExecutor):
    """Never eos (ids >= 3), answers with launch/collect like the GPU runner."""

    def launch(self, plan, requests):
        return self.execute(plan, requests)

    def collect(self, handle):
        return handle


def make_core(sink=None) -> EngineCore:
    return EngineCore(EngineConfig(cache=CacheConfig(block_size=16, num_blocks=512),
                                   scheduler=SchedulerConfig(max_num_batched_tokens=256, max_model_len=1024)),
                      eos_token_id=2, sink=sink)


def test_client_measures_every_request(smollm2_tokenizer):
    wl = generate(24, rate=60.0, input_len="uniform:8:64", output_len="uniform:2:12", seed=1)
    engine = AsyncLLMEngine(LLMEngine.from_core(make_core(), Overlapping(), smollm2_tokenizer, overlap=True))
    engine.start()
    seen = []
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http:
            records, wall = serve_client.run(http.url + "/v1", wl, "m", progress=seen.append)
    finally:
        engine.shutdown()
    assert len(seen) == len(records) == 24
    assert all(r.ok for r in records), [r.error for r in records]
    assert [r.output_tokens for r in records] == [s.params.max_tokens for s in wl]
    assert all(r.ttft is not None and r.ttft <= r.e2e for r in records)
    assert max(abs(r.sent - r.arrival) for r in records) < 2.0  # sent on schedule (a loaded CI machine lags)
    summary = serve_client.summarize(records, wall, Slo.parse("ttft_ms=60000,tpot_ms=60000"))
    assert summary["completed"] == 24 and summary["slo_attainment"] == 1.0
    assert summary["ttft_ms"]["p50"] <= summary["e2e_ms"]["p50"]
    assert "goodput under SLO" in serve_client.render(summary)


def test_sharded_client_sends_every_request_once_on_schedule(smollm2_tokenizer):
    from runtime.bench.serve_shards import run_sharded

    wl = generate(15, rate=40.0, input_len="uniform:8:64", output_len="uniform:2:12", seed=4)
    engine = AsyncLLMEngine(LLMEngine.from_core(make_core(), Overlapping(), smollm2_tokenizer, overlap=True))
    engine.start()
    seen = []
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http:
            bodies, records = serve_client.prepare(wl, "m")
            records, wall = run_sharded(3, http.url + "/v1", bodies, records, None, 60.0, 64, None, seen.append)
    finally:
        engine.shutdown()
    assert len(seen) == 15 and [r.index for r in records] == list(range(15))
    assert all(r.ok for r in records), [r.error for r in records]
    assert [r.output_tokens for r in records] == [s.params.max_tokens for s in wl]
    assert [r.arrival for r in records] == [s.arrival - wl.requests[0].arrival for s in wl]
    assert max(abs(r.sent - r.arrival) for r in records) < 2.0 and wall >= records[-1].arrival


def test_a_failing_client_process_is_an_error_not_a_hang():
    from runtime.bench.serve_shards import run_sharded

    bodies, records = serve_client.prepare(generate(2, rate=10.0, input_len="fixed:4", output_len="fixed:2"), "m")
    with pytest.raises(RuntimeError, match="client process failed"):
        run_sharded(2, "http://127.0.0.1:9/v1", [object()] * 2, records, None, 5.0, 4, None, None)


def test_connection_errors_are_counted_not_raised():
    wl = generate(3, rate=100.0, input_len="fixed:4", output_len="fixed:2", seed=0)
    records, wall = serve_client.run("http://127.0.0.1:9/v1", wl, "m", timeout=5.0)
    assert serve_client.summarize(records, wall)["errors"] == {"connect": 3}


def test_slo_parse_and_met():
    slo = Slo.parse("ttft_ms=100, tpot_ms=11")
    fast = RequestRecord(0, 0.0, 4, 3, ttft=0.05, e2e=0.07, output_tokens=3)
    slow = RequestRecord(1, 0.0, 4, 3, ttft=0.05, e2e=0.2, output_tokens=3)
    assert slo.met(fast) and not slo.met(slow)
    for bad in ("ttft=1", "ttft_ms=x", "tpot_ms=-1"):
        with pytest.raises(ValueError):
            Slo.parse(bad)


def test_live_runner_stamps_workload_arrivals():
    wl = generate(12, rate=80.0, input_len="uniform:4:40", output_len="uniform:1:6", seed=2)
    events = []
    engine = LLMEngine.from_core(make_core(events.append), Overlapping())
    finished = []
    steps = replay_live(engine, wl, on_finish=finished.append)
    assert steps > 0 and sum(finished) == 12 and not engine.busy
    arrived = [e for e in events if isinstance(e, Arrived)]
    t0 = arrived[0].time
    assert [round(e.time - t0, 6) for e in arrived] == [round(s.arrival - wl.requests[0].arrival, 6) for s in wl]


def test_bench_serve_launch_and_bench_live_on_a_tiny_model(tmp_path, capsys):
    """One command starts the server, replays, stops it and leaves a log that analyze reads; bench
    live runs the same workload in process."""
    from analysis.frames import load_frames
    from runtime.cli import main
    from tests.model_helpers import make_tiny

    tiny = make_tiny("llama", tmp_path / "m", tokenizer=True)
    flags = ["--synthetic", "6", "--rate", "20", "--input-len", "uniform:4:24", "--output-len", "fixed:5",
             "--prompt-vocab", "300", "--no-progress"]
    log = tmp_path / "server.jsonl"
    assert main(["bench", "serve", *flags, "--json", str(tmp_path / "s.json"), "--server-trace", str(log),
                 "--server-log", str(tmp_path / "logs" / "server.out"),  # (a folder not made yet)
                 "--launch", "--model", str(tiny.folder),
                 "--device", "cpu", "--num-blocks", "256"]) == 0
    out = capsys.readouterr().out
    assert "6/6 requests" in out
    frames = load_frames(log)
    assert len(frames.requests) == 6 and (frames.requests["num_output_tokens"] == 5).all()
    # the engine's side of the latencies, from that log, beside the client's
    assert "client vs engine" in out and "engine median decode step" in out
    doc = json.loads((tmp_path / "s.json").read_text())["engine_vs_client"]
    assert doc["compared"] == doc["paired"] == doc["paired_by_id"] == 6  # each with its own engine request, by its id
    gap = doc["metrics"]
    assert gap["itl"]["p50"]["gap"] == pytest.approx(gap["itl"]["p50"]["client"] - gap["itl"]["p50"]["engine"])
    # per request, the client waits for the engine's first token, then for its trip: never sooner
    for key in ("ttft", "e2e"):
        assert all(gap[key][p]["gap"] > 0 and gap[key][p]["engine"] >= 0 for p in ("p50", "p90", "p99"))
    assert "bottleneck: " in out
    live = tmp_path / "live.jsonl"
    assert main(["bench", "live", *flags, "--trace", str(live), "--model", str(tiny.folder), "--device", "cpu",
                 "--num-blocks", "256"]) == 0
    assert (load_frames(live).requests["num_output_tokens"] == 5).all()


def test_text_prompts_and_folded_ids():
    wl = generate(3, rate=10.0, input_len="fixed:6", output_len="fixed:2", seed=3)
    text = serve_client.request_bodies(wl, "m", decode=lambda ids: " ".join(map(str, ids)))
    ids = serve_client.request_bodies(wl, "m", vocab=50)
    assert all(isinstance(b["prompt"], str) and len(b["prompt"].split()) == 6 for b in text)
    assert all(max(b["prompt"]) < 50 and b["stream"] and b["ignore_eos"] for b in ids)


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/",
                                 " http://h:8000/v1 "])
def test_the_api_base_takes_the_address_with_or_without_v1(url):
    from runtime.bench.server_probe import api_base

    assert api_base(url) == "http://h:8000/v1"


def test_bench_serve_reaches_the_server_at_its_address_with_or_without_v1(smollm2_tokenizer, capsys):
    from runtime.cli import main

    engine = AsyncLLMEngine(LLMEngine.from_core(make_core(), Overlapping(), smollm2_tokenizer, overlap=True))
    engine.start()
    flags = ["bench", "serve", "--synthetic", "3", "--rate", "50", "--input-len", "fixed:8", "--output-len",
             "fixed:2", "--no-progress"]
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http:
            for url in (http.url, http.url + "/", http.url + "/v1/"):
                assert main([*flags, "--url", url]) == 0
                assert "3/3 requests" in capsys.readouterr().out
    finally:
        engine.shutdown()


class _NotOpenAI:
    """A plain HTTP server in a thread answering every GET with ``status`` and ``body``."""

    def __init__(self, status: int, body: bytes) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _bench_serve_fails(url: str, capsys, *flags: str) -> str:
    from runtime.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "serve", "--synthetic", "2", "--no-progress", "--url", url, *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_bench_serve_says_why_a_url_is_no_server_it_can_use(capsys):
    import socket

    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        err = _bench_serve_fails(url, capsys)
        assert err.startswith(f"minivllm: error: --url: no server answers at {url}/v1 (") and "is it running?" in err
        assert _bench_serve_fails(url, capsys, "--served-model-name", "m").startswith(
            "minivllm: error: --url: no server answers")
    with _NotOpenAI(404, b"not here") as web:
        err = _bench_serve_fails(web.url, capsys)
        assert err == (f"minivllm: error: --url: {web.url}/v1/models answered HTTP 404: not an OpenAI-compatible "
                       "server at that address (its API base is usually http://HOST:PORT/v1)")
    with _NotOpenAI(200, b"<html>hello</html>") as web:
        err = _bench_serve_fails(web.url + "/v1", capsys)
        assert err.startswith(f"minivllm: error: --url: {web.url}/v1/models answered, but not with an OpenAI "
                              "model list")
    with _NotOpenAI(401, b"{}") as web:
        assert "the server wants an API key (--api-key)" in _bench_serve_fails(web.url, capsys)
    assert _bench_serve_fails("127.0.0.1:8000", capsys) == (
        "minivllm: error: --url: expected http://HOST:PORT (optionally ending in /v1), got '127.0.0.1:8000'")


@pytest.mark.parametrize("processes", [1, 2])
def test_a_sessions_workload_is_replayed_closed_loop(smollm2_tokenizer, processes):
    """A turn is sent only once the previous turn of its conversation has been answered, plus its
    think time (as the simulator releases it); the first turns at their own arrivals. With several
    client processes a conversation stays in one."""
    from runtime.bench.serve_shards import run_sharded
    from traces.sessions import generate_sessions

    wl = generate_sessions(4, rate=40.0, turns="fixed:3", think_time=0.05, first_len="fixed:32",
                           message_len="fixed:16", output_len="fixed:4", seed=2)
    engine = AsyncLLMEngine(LLMEngine.from_core(make_core(), Overlapping(), smollm2_tokenizer, overlap=True))
    engine.start()
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http:
            bodies, records = serve_client.prepare(wl, "m", vocab=1000)
            if processes == 1:
                wall = serve_client.run_loop(serve_client.replay(http.url + "/v1", bodies, records, None, 60.0, 64,
                                                                 None))
            else:
                records, wall = run_sharded(processes, http.url + "/v1", bodies, records, None, 60.0, 64, None, None)
    finally:
        engine.shutdown()
    assert all(r.ok for r in records), [r.error for r in records]
    by_index = {r.index: r for r in records}
    firsts = [r for r in records if r.after is None]
    assert len(firsts) == 4 and all(r.arrival == wl.requests[r.index].arrival - wl.requests[0].arrival for r in firsts)
    for r in records:
        if r.after is not None:
            previous = by_index[r.after]
            assert previous.session == r.session and previous.index < r.index
            assert r.arrival >= previous.sent + previous.e2e + r.think - 1e-6 and r.think > 0
            assert r.sent >= r.arrival - 0.005  # (an event loop's timers may wake a millisecond early)


def test_the_workload_is_fitted_to_the_servers_max_model_len(smollm2_tokenizer):
    """The server's model card says its max_model_len; bench serve leaves out a request whose prompt
    fills it and cuts the output of one that would pass it (a 400 each otherwise), saying how many."""
    from runtime.bench.server_probe import served_models
    from runtime.cli.bench_serve import fit_to_server

    engine = AsyncLLMEngine(LLMEngine.from_core(make_core(), Overlapping(), smollm2_tokenizer, overlap=True))
    engine.start()
    try:
        with ServerThread(create_app(engine, smollm2_tokenizer, "m")) as http:
            assert served_models(http.url + "/v1") == {"m": 1024}
    finally:
        engine.shutdown()
    wl = generate(30, rate=10.0, input_len="uniform:8:1200", output_len="fixed:300", seed=5)
    fitted, dropped, cut = fit_to_server(wl, 1024)
    assert dropped == sum(s.num_prompt_tokens >= 1024 for s in wl) > 0
    assert cut == sum(1024 - 300 < s.num_prompt_tokens < 1024 for s in wl) > 0
    assert len(fitted) == len(wl) - dropped
    assert all(s.num_prompt_tokens + s.params.max_tokens <= 1024 for s in fitted)
    assert fit_to_server(fitted, 1024) == (fitted, 0, 0)
