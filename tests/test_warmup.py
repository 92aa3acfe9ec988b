"""Warm-up: the served engine starts as if freshly built (same tokens, same log), /ready answers
503 until the warm-up is done, and the warm-up runs every kind of step."""

from __future__ import annotations

import time

import httpx
import pytest

from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.llm_engine import LLMEngine
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from runtime.serving.warmup import warm_up
from tests.model_helpers import make_tiny, one_thread
from traces.log import read_log
from traces.params import SamplingParams

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

PARAMS = [SamplingParams(max_tokens=6, temperature=0.9, top_k=30, seed=None, ignore_eos=True),
          SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True),
          SamplingParams(max_tokens=7, temperature=1.0, repetition_penalty=1.2, ignore_eos=True)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("warmup"), tokenizer=True)


def untimed(path):
    """The log's events without their times (the Header aside)."""
    return [{f: getattr(e, f) for f in e.__struct_fields__ if f not in ("time", "start", "end")}
            for e in list(read_log(path))[1:]]


def test_a_warmed_up_engine_serves_what_a_fresh_one_does(tiny, tmp_path):
    results = []
    for warm in (False, True):
        log = tmp_path / f"log{warm}.jsonl"
        engine = LLMEngine(str(tiny.folder), device="cpu", block_size=4, num_blocks=128, max_model_len=128,
                           max_num_seqs=20, trace=str(log))
        if warm:
            report = warm_up(engine)
            assert report.steps > 10 and report.requests > 20
        rids = [engine.add_request([5 + i, 6, 7, 8 + i], p) for i, p in enumerate(PARAMS)]
        tokens = {rid: [] for rid in rids}
        while engine.busy:
            for d in engine.step():
                tokens[d.request_id] += d.token_ids
        engine.close()
        results.append((tokens, untimed(log)))
    assert results[0] == results[1]


def test_ready_is_503_until_warmed_up(tiny):
    engine = LLMEngine(str(tiny.folder), device="cpu", block_size=4, num_blocks=128, max_model_len=128,
                       max_num_seqs=20)
    async_engine = AsyncLLMEngine(engine, warmup=True)
    with ServerThread(create_app(async_engine, engine.tokenizer, "m")) as http:
        assert httpx.get(http.url + "/ready").status_code == 503  # not started: not ready
        async_engine.start()
        deadline = time.monotonic() + 120
        codes = set()
        while not async_engine.ready.is_set() and time.monotonic() < deadline:
            code = httpx.get(http.url + "/ready").status_code
            if not async_engine.ready.is_set():  # (it may have become ready during the request)
                codes.add(code)
            assert httpx.get(http.url + "/health").status_code == 200
            time.sleep(0.05)
        assert async_engine.ready.is_set() and async_engine.warmup_report.steps > 0
        assert httpx.get(http.url + "/ready").status_code == 200
        assert 200 not in codes
        assert "minivllm_engine_ready 1.0" in httpx.get(http.url + "/metrics").text
    async_engine.shutdown()
