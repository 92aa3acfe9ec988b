"""HF ``transformers serve`` as a bench serve peer: the random-weight checkpoint folder, the client's
handling of what that server does differently (no ``[DONE]``, 422 on unknown fields), the time limit,
the peer runner's phases and failures (against a fake server), and one real run (slow)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.bench import hf_serve_peer, serve_client
from runtime.bench.hf_checkpoint import checkpoint_config, write_checkpoint
from runtime.bench.hf_checkpoint import main as checkpoint_main
from runtime.executor.model.spec import MODEL_SHAPES
from runtime.serving.server.launch import ServerThread, free_port
from tests.model_helpers import save_tiny_tokenizer
from traces.generators import generate

TINY_SET = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2)


# --- the checkpoint -----------------------------------------------------------------------------------

def test_checkpoint_config_is_the_shape_with_overrides():
    assert checkpoint_config("qwen3-0.6b") == MODEL_SHAPES["qwen3-0.6b"]
    small = checkpoint_config("qwen3-0.6b", TINY_SET)
    assert small["head_dim"] == 16 and small["vocab_size"] == 151936 and small["tie_word_embeddings"]
    assert checkpoint_config("qwen3-0.6b", {"hidden_size": 64, "head_dim": 32})["head_dim"] == 32
    with pytest.raises(ValueError, match="unknown config key"):
        checkpoint_config("qwen3-0.6b", {"num_layers": 2})
    with pytest.raises(ValueError, match="unknown model shape"):
        checkpoint_config("gpt-5")


def test_checkpoint_loads_in_hf_and_in_our_loader(tmp_path):
    import transformers

    from runtime.executor.model.loader import load_model

    tok = tmp_path / "tok"
    save_tiny_tokenizer(tok)
    out = write_checkpoint(tmp_path / "ckpt", tokenizer=tok, dtype="float32", overrides=TINY_SET)
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == -1
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(hf).__name__ == "Qwen3ForCausalLM" and hf.config.vocab_size == 151936
    assert hf.generation_config.eos_token_id == -1
    assert transformers.AutoTokenizer.from_pretrained(out).decode([5, 6]) != ""
    ours = load_model(out, device="cpu", dtype="float32")  # the same architecture in our loader
    assert ours.spec.vocab_size == 151936 and ours.spec.num_layers == 2 and ours.spec.head_dim == 16


def test_checkpoint_refuses_a_tokenizer_beyond_the_vocab(tmp_path):
    tok = tmp_path / "tok"
    save_tiny_tokenizer(tok)  # ~317 ids
    with pytest.raises(ValueError, match="beyond the model's vocab_size 100"):
        write_checkpoint(tmp_path / "ckpt", tokenizer=tok, dtype="float32", overrides={**TINY_SET, "vocab_size": 100})
    with pytest.raises(FileNotFoundError):
        write_checkpoint(tmp_path / "ckpt2", tokenizer=tmp_path, dtype="float32", overrides=TINY_SET)


def test_checkpoint_cli(tmp_path, capsys):
    assert checkpoint_main([str(tmp_path / "c"), "--dtype", "float32", "--keep-eos", "--set",
                            *(f"{k}={v}" for k, v in TINY_SET.items())]) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((tmp_path / "c" / "generation_config.json").read_text())["eos_token_id"] == 151645
    with pytest.raises(SystemExit):
        checkpoint_main([str(tmp_path / "d"), "--set", "hidden_size"])


# --- the client against a server that talks like transformers serve ------------------------------------

def hf_like_app(token_delay: float = 0.0):
    """/v1/completions as transformers serve 5.x streams it: text chunks, a last chunk with
    finish_reason and usage, no [DONE]; unknown fields: 422. Model "cut" closes the stream early."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()
    known = {"model", "prompt", "max_tokens", "temperature", "stream", "stream_options", "seed"}

    @app.post("/v1/completions")
    async def completions(body: dict):
        unexpected = set(body) - known
        if unexpected:
            return JSONResponse({"detail": f"Unexpected fields in the request: {unexpected}"}, status_code=422)
        if not isinstance(body["prompt"], str):
            return JSONResponse({"detail": "prompt must be a string."}, status_code=400)
        n = body["max_tokens"]

        async def events():
            for i in range(n):
                await asyncio.sleep(token_delay)
                if i % 3 != 1:  # some tokens decode to nothing: no chunk
                    yield f"data: {json.dumps({'choices': [{'index': 0, 'text': f' t{i}'}]})}\n\n"
            if body["model"] == "cut":
                return
            last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}}
            yield f"data: {json.dumps(last)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_streams_without_done_count_when_they_finish():
    wl = generate(6, rate=200.0, input_len="fixed:8", output_len="uniform:2:9", seed=4)
    with ServerThread(hf_like_app()) as http:
        records, wall = serve_client.run(http.url + "/v1", wl, "m", ignore_eos=False, decode=str)
        cut, _ = serve_client.run(http.url + "/v1", wl, "cut", ignore_eos=False, decode=str)
    assert all(r.ok for r in records), [(r.error, r.detail) for r in records]
    assert [r.output_tokens for r in records] == [s.params.max_tokens for s in wl]
    assert {r.error for r in cut} == {"incomplete"}


def test_rejections_keep_the_servers_reason():
    wl = generate(3, rate=200.0, input_len="fixed:8", output_len="fixed:4", seed=5)
    with ServerThread(hf_like_app()) as http:
        records, wall = serve_client.run(http.url + "/v1", wl, "m", decode=str)  # ignore_eos: unknown to it
        ids, _ = serve_client.run(http.url + "/v1", wl, "m", ignore_eos=False)  # token-id prompts
    summary = serve_client.summarize(records, wall)
    assert summary["errors"] == {"http 422": 3} and "ignore_eos" in summary["error_examples"]["http 422"]
    assert "http 422, e.g.: " in serve_client.render(summary)
    assert {r.detail for r in ids} == {'{"detail":"prompt must be a string."}'}


def test_time_limit_cancels_what_is_left():
    wl = generate(8, rate=4.0, input_len="fixed:8", output_len="fixed:40", seed=6)  # ~2 s of arrivals
    late = [s.arrival - wl.requests[0].arrival > 0.43 for s in wl]
    assert any(late) and not all(late)
    with ServerThread(hf_like_app(token_delay=0.025)) as http:  # ~1 s per request
        records, wall = serve_client.run(http.url + "/v1", wl, "m", ignore_eos=False, decode=str, time_limit=0.43)
    assert wall < 5.0
    assert [r.error for r in records] == ["not sent" if x else "time limit" for x in late]
    assert serve_client.summarize(records, wall)["completed"] == 0


# --- the peer runner (fake server) ----------------------------------------------------------------------

FAKE_SERVER = textwrap.dedent("""
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    port, mode = int(sys.argv[1]), sys.argv[2]
    if mode == "die":
        sys.exit(7)
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            print("request", self.path, flush=True)
        def reply(self, code, doc):
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self.reply(200 if mode != "never" else 503, {"status": "ok"})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = body["max_tokens"] - (1 if mode == "eos" else 0)
            self.reply(200, {"usage": {"completion_tokens": n}})
    print("fake peer up", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
""")


@pytest.fixture
def fake_peer(tmp_path, monkeypatch):
    script = tmp_path / "fake_peer.py"
    script.write_text(FAKE_SERVER)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    modes = {}
    monkeypatch.setattr(hf_serve_peer, "serve_command",
                        lambda checkpoint, port, **kw: [sys.executable, str(script), str(port), modes["mode"]])

    def run(mode: str, *extra: str, command: tuple[str, ...] = ("true",)) -> int:
        modes["mode"] = mode
        return hf_serve_peer.main([str(ckpt), "--port", str(free_port()), "--log", str(tmp_path / f"{mode}.log"),
                                   "--ready-timeout", "20", *extra, "--", *command])

    return run


def test_peer_runner_runs_the_command_between_start_and_stop(fake_peer, capsys):
    assert fake_peer("ok") == 0
    assert fake_peer("ok", command=(sys.executable, "-c", "raise SystemExit(5)")) == 5
    err = capsys.readouterr().err
    assert "ready after" in err and "warmed up (4 requests)" in err and "fake peer up" in err


def test_peer_runner_fails_fast_and_says_why(fake_peer, capsys):
    assert fake_peer("die") == hf_serve_peer.NOT_READY
    assert "exited with status 7 before it was ready" in capsys.readouterr().err
    assert fake_peer("never", "--ready-timeout", "1") == hf_serve_peer.NOT_READY
    assert "did not answer" in capsys.readouterr().err
    assert fake_peer("eos") == hf_serve_peer.WARMUP_FAILED
    assert "is eos disabled" in capsys.readouterr().err
    slow = (sys.executable, "-c", "import time; time.sleep(30)")
    assert fake_peer("ok", "--run-timeout", "1", command=slow) == hf_serve_peer.TIMED_OUT


def test_serve_command_preloads_the_folder():
    cmd = hf_serve_peer.serve_command("/m", port=9, device="cuda", dtype="bfloat16", extra=["--cb-num-blocks", "8"])
    assert cmd[1:5] == ["-m", "transformers.cli.transformers", "serve", "/m"]
    assert "--continuous-batching" in cmd and cmd[-2:] == ["--cb-num-blocks", "8"]
    assert hf_serve_peer.peer_env()["HF_HUB_OFFLINE"] == "1"


# --- the real thing ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_transformers_serve_under_bench_serve(tmp_path):
    """A tiny random Qwen3 served by `transformers serve --continuous-batching` on the CPU, replayed by
    bench serve: every request completes with its requested output length."""
    try:
        from transformers.utils.import_utils import is_serve_available
    except ImportError:
        pytest.skip("this transformers has no serve")
    if not is_serve_available():
        pytest.skip("transformers serve's packages (fastapi, uvicorn, openai, pydantic) are missing")
    tok = tmp_path / "tok"
    save_tiny_tokenizer(tok)
    ckpt = str(write_checkpoint(tmp_path / "ckpt", tokenizer=tok, dtype="float32",
                                overrides={**TINY_SET, "vocab_size": 320}))
    port = free_port()
    report = tmp_path / "hf.json"
    bench = [sys.executable, "-m", "runtime", "bench", "serve", "--synthetic", "8", "--rate", "8",
             "--input-len", "uniform:4:40", "--output-len", "uniform:2:12", "--prompt-vocab", "300",
             "--url", f"http://127.0.0.1:{port}/v1", "--served-model-name", ckpt, "--text-prompts", ckpt,
             "--no-ignore-eos", "--no-progress", "--time-limit", "120", "--json", str(report)]
    status = hf_serve_peer.main([ckpt, "--device", "cpu", "--dtype", "float32", "--port", str(port),
                                 "--serve-flags=--cb-num-blocks 64 --cb-block-size 16 --cb-max-batch-tokens 256",
                                 "--log", str(tmp_path / "peer.log"), "--ready-timeout", "240", "--run-timeout",
                                 "240", "--", *bench])
    assert status == 0, Path(tmp_path / "peer.log").read_text()[-3000:]
    doc = json.loads(report.read_text())
    wl = generate(8, rate=8, input_len="uniform:4:40", output_len="uniform:2:12", seed=0)
    assert doc["summary"]["completed"] == 8
    assert [r["output_tokens"] for r in doc["requests"]] == [s.params.max_tokens for s in wl]
