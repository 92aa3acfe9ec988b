"""Issue 10, point 5: the server stamps a request's arrival when it receives it, so the log's
Arrived time (and TTFT) is what the client saw, not when the engine thread got to it."""

from __future__ import annotations

import threading
import time

import httpx

from tests.test_server_harness import assert_still_serving, serve, wait_idle
from traces.events import Admitted, Arrived, Finished

STALL = 0.6  # seconds the engine thread is stuck in a step while the request comes in


def test_logged_arrival_is_the_receive_time_not_the_pickup(smollm2_tokenizer):
    events = []
    gate = threading.Event()
    with serve(smollm2_tokenizer, gate=gate, sink=events.append) as s:
        first = threading.Thread(target=lambda: httpx.post(
            s.url + "/v1/completions", json={"prompt": "first", "max_tokens": 2}, timeout=30))
        first.start()
        deadline = time.monotonic() + 10
        while not any(isinstance(e, Arrived) for e in events):  # the engine took it in: now stuck in its step
            assert time.monotonic() < deadline
            time.sleep(0.01)
        sent = s.engine.now()
        result = {}
        second = threading.Thread(target=lambda: result.setdefault("r", httpx.post(
            s.url + "/v1/completions", json={"prompt": "second", "max_tokens": 2}, timeout=30)))
        second.start()
        time.sleep(STALL)
        gate.set()  # the engine thread picks the second request up only now
        first.join()
        second.join()
        assert result["r"].status_code == 200
        wait_idle(s.engine)

        arrived = {e.request_id: e.time for e in events if isinstance(e, Arrived)}
        admitted = {e.request_id: e.time for e in events if isinstance(e, Admitted)}
        finished = {e.request_id: e.time for e in events if isinstance(e, Finished)}
        rid = max(arrived)
        assert sent <= arrived[rid] < sent + 0.2  # received (the HTTP layer's stamp) ...
        assert admitted[rid] >= sent + STALL - 0.05  # ... long before the engine could look at it
        # so the wait the client saw is in the log (a pickup stamp would make it ~0) and in the metrics
        waited = admitted[rid] - arrived[rid]
        assert waited >= STALL - 0.25 and finished[rid] - arrived[rid] > waited
        metrics = httpx.get(s.url + "/metrics").text
        queue = next(line for line in metrics.splitlines() if line.startswith("vllm:request_queue_time_seconds_sum"))
        assert float(queue.rsplit(" ", 1)[1]) >= STALL - 0.25
        assert_still_serving(s)
