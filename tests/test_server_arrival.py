"""The server stamps a request's arrival when it receives it, so the log's
Arrived time (and TTFT) is what the client saw, not when the engine got to it — the engine in
this process or in its own."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.test_server_harness import MODES, assert_still_serving, serve, wait_idle, wait_until
from traces.events import Admitted, Arrived, Finished

STALL = 0.6  # seconds the engine is stuck in a step while the request comes in


@pytest.mark.parametrize("mode", MODES)
def test_logged_arrival_is_the_receive_time_not_the_pickup(smollm2_tokenizer, mode, tmp_path):
    with serve(smollm2_tokenizer, mode=mode, gate=True, log=tmp_path / "log.jsonl") as s:
        first = threading.Thread(target=lambda: httpx.post(
            s.url + "/v1/completions", json={"prompt": "first", "max_tokens": 2}, timeout=30))
        first.start()
        wait_until(lambda: s.engine.state.adds_taken == 1, what="the first request taken in")  # now stuck
        sent = s.engine.now()
        result = {}
        second = threading.Thread(target=lambda: result.setdefault("r", httpx.post(
            s.url + "/v1/completions", json={"prompt": "second", "max_tokens": 2}, timeout=30)))
        second.start()
        wait_until(lambda: s.engine._adds_sent == 2, what="the second request received and queued")
        queued = s.engine.now()
        time.sleep(STALL)
        s.gate.set()  # the engine picks the second request up only now
        first.join()
        second.join()
        assert result["r"].status_code == 200
        wait_idle(s.engine)
        # (the engine in its own process may write the log's last Finished after the response went out)
        wait_until(lambda: sum(isinstance(e, Finished) for e in s.events()) == 2, what="both Finished in the log")

        events = s.events()
        arrived = {e.request_id: e.time for e in events if isinstance(e, Arrived)}
        admitted = {e.request_id: e.time for e in events if isinstance(e, Admitted)}
        finished = {e.request_id: e.time for e in events if isinstance(e, Finished)}
        rid = max(arrived)
        # received (the HTTP layer's stamp, on the engine's clock even from another process) ...
        assert sent <= arrived[rid] <= queued
        assert admitted[rid] >= queued + STALL  # ... long before the engine could look at it
        # so the wait the client saw is in the log (a pickup stamp would make it ~0) and in the metrics
        waited = admitted[rid] - arrived[rid]
        assert waited >= STALL and finished[rid] - arrived[rid] > waited
        metrics = httpx.get(s.url + "/metrics").text
        queue = next(line for line in metrics.splitlines() if line.startswith("vllm:request_queue_time_seconds_sum"))
        assert float(queue.rsplit(" ", 1)[1]) >= STALL - 0.25
        assert_still_serving(s)
