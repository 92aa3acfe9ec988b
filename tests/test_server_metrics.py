"""/metrics exports the vLLM names dashboards read, with vLLM's meaning and a
``model_name`` label, next to the minivllm_* ones; abort counters agree with the log's Aborted
events, even for streams cut before the engine took them in (before their answer could start: it
names the request in the log, so it waits for the engine to take the request in)."""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from runtime.serving.async_engine import CLIENT_DISCONNECTED
from runtime.serving.server.metrics import build_1_2_5_buckets
from tests.proc_helpers import scrape, value
from tests.test_server_harness import MODES, assert_still_serving, serve, wait_idle, wait_until
from traces.events import Aborted, Admitted, Arrived

VLLM_NAMES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_count",
    "vllm:request_success_total", "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:request_prompt_tokens_sum", "vllm:request_generation_tokens_sum",
    "vllm:request_queue_time_seconds_count",
)


def test_buckets_as_vllm_builds_them():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(1024)[-1] == 1000


@pytest.mark.parametrize("mode", MODES)
def test_vllm_metrics_count_what_was_served(smollm2_tokenizer, mode):
    with serve(smollm2_tokenizer, name="smol", mode=mode) as s:
        prompt = [7] * 40  # two full KV blocks: the repeat hits the prefix cache
        for _ in range(2):
            s.client.completions.create(model="smol", prompt=prompt, max_tokens=5)
        chat = s.client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3)
        wait_idle(s.engine)
        m = scrape(s.url)
        for name in VLLM_NAMES:
            assert any(n == name and ("model_name", "smol") in ls for n, ls in m), name
        prompt_tokens = 2 * 40 + chat.usage.prompt_tokens
        assert value(m, "vllm:prompt_tokens_total") == prompt_tokens
        assert value(m, "vllm:generation_tokens_total") == 13
        assert value(m, "vllm:request_success_total", finished_reason="length") == 3
        assert value(m, "vllm:request_success_total", finished_reason="abort") == 0
        assert value(m, "vllm:time_to_first_token_seconds_count") == 3
        assert value(m, "vllm:inter_token_latency_seconds_count") == 4 + 4 + 2  # one per token gap
        assert value(m, "vllm:e2e_request_latency_seconds_count") == 3
        assert value(m, "vllm:request_queue_time_seconds_count") == 3
        assert value(m, "vllm:request_prompt_tokens_sum") == prompt_tokens
        assert value(m, "vllm:request_generation_tokens_sum") == 13
        assert value(m, "vllm:request_prompt_tokens_bucket", le="1000.0") == 3
        assert value(m, "vllm:prefix_cache_queries_total") == prompt_tokens
        assert value(m, "vllm:prefix_cache_hits_total") >= 32  # the repeat's two full blocks
        assert value(m, "vllm:num_preemptions_total") == 0
        assert value(m, "vllm:num_requests_running") == value(m, "vllm:num_requests_waiting") == 0
        assert value(m, "vllm:kv_cache_usage_perc") == 0.0
        assert value(m, "minivllm_generation_tokens_total") == 13  # the old names stay
        assert value(m, "minivllm_prompt_tokens_total") == prompt_tokens  # every request got its first token
        assert_still_serving(s, "smol")


@pytest.mark.parametrize("mode", MODES)
def test_kv_cache_usage_is_a_fraction_while_running(smollm2_tokenizer, mode):
    with serve(smollm2_tokenizer, mode=mode, delay=0.05) as s:  # 40 tokens: 2 s of steps to look at
        worker = threading.Thread(target=lambda: s.client.completions.create(model="m", prompt=[5] * 100,
                                                                           max_tokens=40))
        worker.start()
        deadline = time.monotonic() + 10
        while (m := scrape(s.url)) and value(m, "vllm:num_requests_running") == 0:  # the engine's last snapshot
            assert time.monotonic() < deadline
            time.sleep(0.01)
        worker.join()
        assert value(m, "vllm:num_requests_running") == 1
        assert 0 < value(m, "vllm:kv_cache_usage_perc") <= 1
        # 100 prompt tokens and a few outputs: 7 blocks of 16
        assert value(m, "vllm:kv_cache_usage_perc") == pytest.approx(7 / s.engine.state.kv_blocks_total)
        assert value(m, "minivllm_kv_blocks_used") == 7
        assert_still_serving(s)


@pytest.mark.parametrize("mode", MODES)
def test_abort_counts_agree_with_the_log_after_a_disconnect_storm(smollm2_tokenizer, mode, tmp_path):
    # the engine is stuck in a step: the storm's requests only queue; later, 10 ms steps let the
    # mid-stream hang-ups come before the end
    with serve(smollm2_tokenizer, mode=mode, gate=True, delay=0.01, log=tmp_path / "log.jsonl",
               max_pending=256) as s:
        holder = threading.Thread(target=lambda: httpx.post(s.url + "/v1/completions",
                                                            json={"prompt": "hold", "max_tokens": 2}, timeout=60))
        holder.start()
        wait_until(lambda: s.engine.state.adds_taken == 1, what="the holder taken in")  # now stuck in its step

        def send(i: int) -> socket.socket:
            """A stream whose answer (headers, the role chunk) waits for the engine to take it in."""
            body = json.dumps({"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 50,
                               "stream": True}).encode()
            address = urlsplit(s.url)
            sock = socket.create_connection((address.hostname, address.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            return sock

        storm = [send(i) for i in range(12)]
        wait_until(lambda: s.engine.load().outstanding == 13, what="the storm sent to the engine")
        for sock in storm:  # hang up
            sock.close()
        # the server has seen every hang-up (cancelled before the engine took them in)
        wait_until(lambda: s.engine.load().outstanding == 1, what="the storm cancelled")
        s.gate.set()
        holder.join()
        wait_idle(s.engine)

        # and some cut mid-stream, after the engine took them in
        for i in range(3):
            with httpx.stream("POST", s.url + "/v1/completions", timeout=30,
                              json={"prompt": f"story {i}", "max_tokens": 500, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        break
        wait_until(lambda: s.engine.stats.client_aborts == 15, what="15 aborts")
        wait_idle(s.engine)

        events = s.events()
        aborted = [e for e in events if isinstance(e, Aborted)]
        assert len(aborted) == 15 and {e.reason for e in aborted} == {CLIENT_DISCONNECTED}
        # the storm's requests are in the log, never scheduled: Arrived then Aborted
        admitted = {e.request_id for e in events if isinstance(e, Admitted)}
        arrived = {e.request_id for e in events if isinstance(e, Arrived)}
        assert not {e.request_id for e in aborted[:12]} & admitted
        assert {e.request_id for e in aborted} <= arrived
        m = scrape(s.url)
        assert value(m, "minivllm_client_aborts_total") == len(aborted) == s.engine.stats.client_aborts
        assert value(m, "minivllm_requests_aborted_total", reason=CLIENT_DISCONNECTED) == len(aborted)
        assert value(m, "vllm:request_success_total", finished_reason="abort") == len(aborted)
        # the storm's prompts were taken in but never prefilled: counted on arrival only
        storm_ids = {e.request_id for e in aborted[:12]}
        storm_tokens = sum(e.prompt.num_tokens for e in events if isinstance(e, Arrived) and e.request_id in storm_ids)
        assert value(m, "minivllm_prompt_tokens_total") - value(m, "vllm:prompt_tokens_total") == storm_tokens > 0
        assert_still_serving(s)
