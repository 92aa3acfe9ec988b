"""Requests too large for any context, sent at a steady rate beside a replay (``bench serve
--oversized-rate R``): chat bodies of 240,000 one-character messages (8 MB, under the default body
limit), which a server must refuse for the price of counting them, not of templating them. The
report says how each was answered and how fast; the replay's own latencies, against a run without
them, say what they cost a normal request."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import threading
import time
from dataclasses import dataclass

import httpx

from runtime.bench.serve_client import percentiles

MESSAGES = 240_000


@dataclass(frozen=True)
class OversizedReport:
    rate: float
    sent: int
    answers: dict[str, int]  # status code (or the error's kind) -> requests
    latency_p50_ms: float | None
    latency_p99_ms: float | None

    def render(self) -> str:
        answers = ", ".join(f"{n:,} × {a}" for a, n in sorted(self.answers.items())) or "none"
        took = ("" if self.latency_p50_ms is None
                else f"; answered in {self.latency_p50_ms:.0f} ms p50, {self.latency_p99_ms:.0f} ms p99")
        return (f"oversized requests ({MESSAGES:,} chat messages each, {self.rate:g}/s): {self.sent:,} sent: "
                f"{answers}{took}")


def body(model: str) -> bytes:
    return json.dumps({"model": model, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "x"}] * MESSAGES}).encode()


class OversizedRequests:
    """POST ``body(model)`` to ``url``/chat/completions ``rate`` times a second on threads of their
    own, from ``__enter__`` to ``__exit__``."""

    def __init__(self, url: str, model: str, rate: float, api_key: str | None = None) -> None:
        self.url, self.rate = url.rstrip("/") + "/chat/completions", rate
        self._body = body(model)
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(headers=headers, timeout=120)
        self._pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="oversized")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send_at_rate, name="oversized", daemon=True)
        self._answers: collections.Counter[str] = collections.Counter()
        self._latencies: list[float] = []
        self._lock = threading.Lock()

    def __enter__(self) -> OversizedRequests:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)  # (none still queued is sent after the replay)
        self._client.close()

    def _send_at_rate(self) -> None:
        due = time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self._pool.submit(self._send_one, due)
            due += 1.0 / self.rate

    def _send_one(self, due: float) -> None:
        """One request, timed from when it was due (a wait for a free sender counts)."""
        try:
            answer = str(self._client.post(self.url, content=self._body).status_code)
        except httpx.HTTPError as e:
            answer = type(e).__name__
        with self._lock:
            self._answers[answer] += 1
            self._latencies.append((time.monotonic() - due) * 1000)

    def report(self) -> OversizedReport:
        with self._lock:
            took, answers = list(self._latencies), dict(self._answers)
        pct = percentiles(took, scale=1.0)
        return OversizedReport(self.rate, len(took), answers, pct["p50"], pct["p99"])
