"""Prometheus metrics of one server: engine counters read at scrape time + latency histograms.

Everything lives in the app's own CollectorRegistry (no process-global state), so two apps in one
process (tests) don't collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from runtime.serving.async_engine import AsyncLLMEngine

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)


class _EngineCollector:
    def __init__(self, engine: AsyncLLMEngine) -> None:
        self.engine = engine

    def collect(self):
        e = self.engine
        s = e.stats
        core = e.core
        bm = core.block_manager

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"minivllm_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"minivllm_{name}", doc, value=value)

        finished = CounterMetricFamily("minivllm_requests_finished", "Finished requests by reason",
                                       labels=["reason"])
        for reason, n in sorted(s.requests_finished.items()):
            finished.add_metric([reason], n)
        yield finished
        yield counter("requests_rejected_overloaded", "Requests refused with 429 (queue full)",
                      s.rejected_overloaded)
        yield counter("client_aborts", "Requests aborted because the client went away", s.client_aborts)
        yield counter("slow_client_cancellations", "Requests aborted because the client read too slowly",
                      s.slow_client_aborts)
        yield counter("prompt_tokens", "Prompt tokens received", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated", s.generation_tokens)
        yield counter("engine_steps", "Engine steps executed", s.steps)
        yield counter("preemptions", "Requests preempted (recompute)", s.preemptions)
        yield counter("prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
                      s.prefix_hit_tokens)
        yield gauge("requests_running", "Requests in the running batch", core.num_running)
        yield gauge("requests_waiting", "Requests waiting for admission", core.num_waiting)
        yield gauge("kv_blocks_total", "KV blocks in the pool", bm.num_blocks)
        yield gauge("kv_blocks_used", "KV blocks referenced by requests", bm.num_used_blocks)
        yield gauge("kv_blocks_cached_free", "Unreferenced blocks kept for prefix reuse", len(bm.evictable))
        yield gauge("kv_blocks_reserved", "Blocks promised to admitted requests", bm.total_reserved)
        yield gauge("engine_alive", "1 while the engine thread runs", 1.0 if e.alive else 0.0)


class ServerMetrics:
    def __init__(self, engine: AsyncLLMEngine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.ttft = Histogram("minivllm_time_to_first_token_seconds", "Arrival to first token",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("minivllm_e2e_request_latency_seconds", "Arrival to last token",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("minivllm_time_per_output_token_seconds", "Mean inter-token time per request",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)

    def observe(self, arrival: float, first_token: float | None, end: float, num_output_tokens: int) -> None:
        if first_token is None:
            return
        self.ttft.observe(first_token - arrival)
        self.e2e.observe(end - arrival)
        if num_output_tokens > 1:
            self.tpot.observe((end - first_token) / (num_output_tokens - 1))
