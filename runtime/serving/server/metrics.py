"""Prometheus metrics of one server: ``minivllm_*`` and the ``vllm:*`` names dashboards built for
vLLM read, with vLLM v1's meaning, buckets and labels (``model_name``, ``engine``; see vLLM's
vllm/v1/metrics/loggers.py).

Counters and gauges are the engine's as of its last message (``AsyncLLMEngine.state``: the engine
sends a snapshot after every step, runtime/serving/engine_loop.py); the latency histograms are fed
with the observations ``LLMEngine.observer`` gathered in the engine (every step's first tokens,
token gaps, ended requests), so a request whose client went away is still measured. Everything lives in the app's own
CollectorRegistry (no process-global state): two apps in one process (tests) don't collide.

vLLM semantics kept: ``vllm:prompt_tokens`` counts a prompt once its prefill is done (first
token), ``minivllm_prompt_tokens`` when the engine takes the request in, so they differ by the
prompts of requests aborted (or failed) before their first token;
``vllm:request_success{finished_reason}`` counts stop / length and ``abort`` (every abort the log
records); ``vllm:inter_token_latency_seconds`` is one observation per token gap;
``vllm:request_queue_time_seconds`` runs from arrival to the start of the step that first
scheduled the request; ``vllm:kv_cache_usage_perc`` is referenced blocks / all blocks (0..1;
cached-but-free blocks count as free); prefix-cache queries and hits are in tokens, per admission.

Speculative decoding (exported when the engine speculates): ``vllm:spec_decode_num_drafts`` counts
the decodes that verified drafts (rounds), ``..._num_draft_tokens`` their drafts,
``..._num_accepted_tokens`` the drafts accepted and ``..._num_accepted_tokens_per_pos{position}``
those by position (0: a round's first draft), all from the tokens each round committed, so they
agree with the log's ``Step.drafts`` / ``Step.tokens`` (traces/speculation.py's ``rounds``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from runtime.engine.drafters import parse_speculative
from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.outputs import StepTimings
from runtime.serving.server.bulk_histogram import BulkHistogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)
# vLLM's
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
_VLLM_LABELS = ["model_name", "engine"]
_ENGINE_INDEX = "0"  # one engine (vLLM labels each data-parallel engine)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, … up to ``max_value`` (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class _EngineCollector:
    def __init__(self, engine: AsyncLLMEngine, model_name: str) -> None:
        self.engine = engine
        self.labels = [model_name, _ENGINE_INDEX]

    def collect(self):
        yield from self._minivllm()
        yield from self._vllm()

    def _minivllm(self):
        e = self.engine
        state = e.state
        s = state.stats

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"minivllm_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"minivllm_{name}", doc, value=value)

        finished = CounterMetricFamily("minivllm_requests_finished", "Finished requests by reason",
                                       labels=["reason"])
        for reason, n in sorted(s.requests_finished.items()):
            finished.add_metric([reason], n)
        yield finished
        aborted = CounterMetricFamily("minivllm_requests_aborted", "Aborted requests by reason (as logged)",
                                      labels=["reason"])
        for reason, n in sorted(s.requests_aborted.items()):
            aborted.add_metric([reason], n)
        yield aborted
        yield counter("requests_rejected_overloaded", "Requests refused with 429 (queue full)",
                      e.rejected_overloaded)
        yield counter("client_aborts", "Requests aborted because the client went away (each one logged)",
                      s.client_aborts)
        yield counter("slow_client_cancellations", "Requests aborted because the client read too slowly",
                      s.slow_client_aborts)
        yield counter("prompt_tokens", "Prompt tokens of the requests taken in, counted on arrival (vllm:prompt_tokens "
                      "counts a prompt once prefilled: they differ by the prompts of requests that ended before "
                      "their first token)", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated", s.generation_tokens)
        yield counter("engine_steps", "Engine steps executed", s.steps)
        yield counter("preemptions", "Requests preempted (recompute)", s.preemptions)
        yield counter("prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
                      s.prefix_hit_tokens)
        yield gauge("requests_running", "Requests in the running batch", state.num_running)
        yield gauge("requests_waiting", "Requests waiting for admission", state.num_waiting)
        yield gauge("kv_blocks_total", "KV blocks in the pool", state.kv_blocks_total)
        yield gauge("kv_blocks_used", "KV blocks referenced by requests", state.kv_blocks_used)
        yield gauge("kv_blocks_cached_free", "Unreferenced blocks kept for prefix reuse", state.kv_blocks_cached_free)
        yield gauge("kv_blocks_reserved", "Blocks promised to admitted requests", state.kv_blocks_reserved)
        yield gauge("engine_alive", "1 while the engine runs", 1.0 if e.alive else 0.0)
        yield gauge("engine_ready", "1 once the engine is warmed up", 1.0 if e.ready.is_set() else 0.0)
        replica_health = getattr(e, "replica_health", None)
        if replica_health is not None:  # a fleet: how many replicas serve, how often one was started again
            replicas = replica_health()
            yield gauge("replicas_up", "Replicas of the fleet taking requests",
                        sum(r["status"] == "up" for r in replicas))
            yield counter("replica_restarts", "Times a replica was started again after it died",
                          sum(r["restarts"] for r in replicas))
        jit = state.jit_compilations
        yield counter("jit_compilations", "Triton kernel specialisations compiled by the engine", jit)
        yield counter("jit_compilations_while_serving", "Of those, compiled after the server became ready "
                      "(each one a stall in some step)", jit - e.jit_at_ready if e.ready.is_set() else 0)

    def _vllm(self):
        state = self.engine.state
        s = state.stats

        def family(cls, name: str, doc: str, value: float):
            metric = cls(f"vllm:{name}", doc, labels=_VLLM_LABELS)
            metric.add_metric(self.labels, value)
            return metric

        yield family(GaugeMetricFamily, "num_requests_running", "Number of requests in model execution batches.",
                     state.num_running)
        yield family(GaugeMetricFamily, "num_requests_waiting", "Number of requests waiting to be processed.",
                     state.num_waiting)
        yield family(GaugeMetricFamily, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                     state.kv_blocks_used / state.kv_blocks_total if state.kv_blocks_total else 0.0)
        yield family(CounterMetricFamily, "prompt_tokens", "Number of prefill tokens processed.",
                     s.prefilled_prompt_tokens)
        yield family(CounterMetricFamily, "generation_tokens", "Number of generation tokens processed.",
                     s.generation_tokens)
        yield family(CounterMetricFamily, "num_preemptions", "Cumulative number of preemption from the engine.",
                     s.preemptions)
        yield family(CounterMetricFamily, "prefix_cache_queries",
                     "Prefix cache queries, in terms of number of queried tokens.", s.prefix_query_tokens)
        yield family(CounterMetricFamily, "prefix_cache_hits",
                     "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hit_tokens)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*_VLLM_LABELS, "finished_reason"])
        reasons = {"stop": 0, "length": 0, "abort": sum(s.requests_aborted.values())}
        for reason, n in s.requests_finished.items():
            reasons[reason] = reasons.get(reason, 0) + n
        for reason, n in sorted(reasons.items()):
            success.add_metric([*self.labels, reason], n)
        yield success
        yield from self._spec_decode(s)

    def _spec_decode(self, s):
        spec = parse_speculative(self.engine.config.speculative)
        if spec is None:
            return
        for name, doc, value in (
                ("spec_decode_num_drafts", "Number of spec decoding drafts.", s.spec_drafts),
                ("spec_decode_num_draft_tokens", "Number of draft tokens.", s.spec_draft_tokens),
                ("spec_decode_num_accepted_tokens", "Number of accepted tokens.", s.spec_accepted_tokens)):
            metric = CounterMetricFamily(f"vllm:{name}", doc, labels=_VLLM_LABELS)
            metric.add_metric(self.labels, value)
            yield metric
        per = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "Accepted tokens per draft position.", labels=[*_VLLM_LABELS, "position"])
        counts = s.spec_accepted_per_pos
        for j in range(max([spec.num_tokens, *(int(p) + 1 for p in counts)])):
            per.add_metric([*self.labels, str(j)], counts.get(str(j), 0))
        yield per


class ServerMetrics:
    """The registry /metrics serves; ``observe`` takes the engine's latency observations (on the
    thread that receives its messages)."""

    def __init__(self, engine: AsyncLLMEngine, model_name: str) -> None:
        self.registry = registry = CollectorRegistry()
        registry.register(_EngineCollector(engine, model_name))
        self.ttft = Histogram("minivllm_time_to_first_token_seconds", "Arrival to first token",
                              buckets=_LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram("minivllm_e2e_request_latency_seconds", "Arrival to last token",
                             buckets=_LATENCY_BUCKETS, registry=registry)
        self.tpot = Histogram("minivllm_time_per_output_token_seconds", "Mean inter-token time per request",
                              buckets=_LATENCY_BUCKETS, registry=registry)

        def vllm(name: str, doc: str, buckets) -> Histogram:
            h = Histogram(f"vllm:{name}", doc, _VLLM_LABELS, buckets=buckets, registry=registry)
            return h.labels(model_name, _ENGINE_INDEX)

        tokens = build_1_2_5_buckets(engine.config.scheduler.max_model_len)
        self.v_ttft = vllm("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           _TTFT_BUCKETS)
        self.v_itl = BulkHistogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                   _ITL_BUCKETS, _VLLM_LABELS, [model_name, _ENGINE_INDEX])  # one a token: in bulk
        registry.register(self.v_itl)
        self.v_e2e = vllm("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                          _REQUEST_BUCKETS)
        self.v_queue = vllm("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                            _REQUEST_BUCKETS)
        self.v_prompt = vllm("request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.v_generation = vllm("request_generation_tokens", "Number of generation tokens processed.", tokens)
        engine.observer = self.observe

    def observe(self, timings: StepTimings) -> None:
        for ttft in timings.first_token_latencies:
            self.ttft.observe(ttft)
            self.v_ttft.observe(ttft)
        self.v_itl.observe_many(timings.token_gaps)
        for r in timings.ended:
            if r.finish_reason == "abort":
                continue  # latency and size of completed requests only
            if r.scheduled_time is not None:
                self.v_queue.observe(r.scheduled_time - r.arrival_time)
            e2e = r.end_time - r.arrival_time
            self.e2e.observe(e2e)
            self.v_e2e.observe(e2e)
            self.v_prompt.observe(r.num_prompt_tokens)
            self.v_generation.observe(r.num_output_tokens)
            if r.num_output_tokens > 1 and r.first_token_time is not None:
                self.tpot.observe((r.end_time - r.first_token_time) / (r.num_output_tokens - 1))
