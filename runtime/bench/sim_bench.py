"""``minivllm bench sim``: a whole trace through the simulator, chunked prefill on and off.

Measures the wall time of the simulation including writing the full event log, and its speed
relative to the simulated time (the engine's virtual clock at the last step's end). The serving
metrics are then computed from the written log (timed separately).

Engine for the default H200 / Qwen3-0.6B run: 65,536 blocks of 16 tokens (about the KV an H200
holds beside 1.2 GB of weights at 0.9 memory utilization, 112 KiB of KV per token), 256
sequences, max_model_len 16,384 (the conversation trace's longest request is 14,089 tokens);
the default budget (runtime/engine/config.py): 2,048 tokens with chunked prefill, max_model_len without.
"""

from __future__ import annotations

import io
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig

DEFAULT_TRACE = "AzureLLMInferenceTrace_conv.csv"
DEFAULT_COST_MODEL = "qwen3-0.6b-h200"


@dataclass
class SimBenchResult:
    name: str
    requests: int
    steps: int
    simulated_s: float
    wall_s: float
    cpu_s: float  # process CPU time of the same span (the machine may be shared)
    speedup: float  # simulated seconds per wall second
    cpu_speedup: float  # simulated seconds per CPU second
    us_per_step: float
    log_bytes: int
    metrics_s: float  # wall time to compute the summary from the log
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    e2e_p99_s: float
    output_tok_s: float
    preemptions: int


TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"  # the public traces the repository carries


def find_trace(name: str = DEFAULT_TRACE) -> Path:
    """A public trace the repository carries (data/traces), by file name."""
    if not (TRACES / name).exists():
        raise FileNotFoundError(f"{name}: not found in {TRACES} (pass --trace PATH)")
    return TRACES / name


def bench_config(chunked: bool, max_model_len: int = 16384) -> EngineConfig:
    return EngineConfig(
        cache=CacheConfig(block_size=16, num_blocks=65536),
        scheduler=SchedulerConfig(max_num_seqs=256, enable_chunked_prefill=chunked, max_model_len=max_model_len),
        model_identity="Qwen3-0.6B")


def run_one(workload, chunked: bool, cost_model, out: Path, progress: bool = True, replicas: int = 1,
            router: str = "round-robin") -> SimBenchResult:
    """One simulation of the whole workload, timed; ``replicas`` > 1: a fleet (``out`` its fleet log)."""
    import contextlib

    from tqdm import tqdm

    from analysis.frames import load_frames
    from analysis.metrics import summarize
    from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
    from traces.events import make_header
    from traces.fleet_log import fleet_extra, replica_log_path
    from traces.log import LogWriter

    config = bench_config(chunked, max(16384, workload.max_request_tokens()))
    name = f"chunked {'on' if chunked else 'off'}" + (f", {replicas} × {router}" if replicas > 1 else "")
    logs = [replica_log_path(out, i) for i in range(replicas)] if replicas > 1 else [out]
    t0, c0 = time.perf_counter(), time.process_time()
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(LogWriter(p)) for p in logs]
        routes = None
        if replicas > 1:
            routes = stack.enter_context(LogWriter(out))
            routes(make_header(config, clock="sim", extra=fleet_extra(router, logs, out)))
        bar = stack.enter_context(tqdm(total=len(workload), unit="req", desc=name, disable=not progress,
                                       mininterval=1.0))
        results = simulate_fleet(workload, [ReplicaSpec(config, cost_model, w) for w in writers], router,
                                 route_sink=routes, progress=bar)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    s = summarize(load_frames(out))
    metrics_s = time.perf_counter() - t1
    steps, end = sum(r.num_steps for r in results), max(r.end_time for r in results)
    return SimBenchResult(
        name=name, requests=sum(r.num_requests for r in results), steps=steps, simulated_s=end,
        wall_s=wall, cpu_s=cpu, speedup=end / wall, cpu_speedup=end / cpu,
        us_per_step=wall / max(steps, 1) * 1e6,
        log_bytes=sum(p.stat().st_size for p in {out, *logs}), metrics_s=metrics_s,
        ttft_p50_ms=s["ttft_s"]["p50"] * 1e3, ttft_p99_ms=s["ttft_s"]["p99"] * 1e3,
        tpot_p50_ms=s["tpot_s"]["p50"] * 1e3, e2e_p99_s=s["e2e_s"]["p99"],
        output_tok_s=s["output_throughput_tok_s"], preemptions=s["preemptions"])


def run(trace: str | None = None, cost_model: str = DEFAULT_COST_MODEL, modes: tuple[bool, ...] = (True, False),
        limit: int | None = None, out_dir: str = "out/bench_sim", progress: bool = True, replicas: int = 1,
        router: str = "round-robin") -> list[SimBenchResult]:
    from simulator.cost.loading import load_cost_model
    from traces.formats import load_workload

    path = Path(trace) if trace else find_trace()
    print(f"reading {path} …", file=sys.stderr, flush=True)
    workload = load_workload(path, limit=limit)
    model = load_cost_model(cost_model)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fleet = f"_{replicas}x{router}" if replicas > 1 else ""
    return [run_one(workload, chunked, model, Path(out_dir) / f"sim_chunked_{'on' if chunked else 'off'}{fleet}.jsonl",
                    progress, replicas, router) for chunked in modes]


def report(results: list[SimBenchResult]) -> str:
    out = io.StringIO()
    width = max(12, *(len(r.name) + 2 for r in results))
    out.write(f"{'mode':<{width}}{'requests':>9}{'steps':>11}{'sim s':>9}{'wall s':>8}{'× real':>8}{'cpu s':>8}"
              f"{'× (cpu)':>8}{'µs/step':>9}"
              f"{'log MB':>8}{'TTFT p50':>10}{'p99 ms':>9}{'TPOT p50':>10}{'E2E p99 s':>10}{'out tok/s':>10}"
              f"{'preempt':>8}\n")
    for r in results:
        out.write(f"{r.name:<{width}}{r.requests:>9,}{r.steps:>11,}{r.simulated_s:>9,.0f}{r.wall_s:>8.1f}"
                  f"{r.speedup:>8.1f}{r.cpu_s:>8.1f}{r.cpu_speedup:>8.1f}{r.us_per_step:>9.1f}"
                  f"{r.log_bytes / 1e6:>8.0f}{r.ttft_p50_ms:>10.1f}"
                  f"{r.ttft_p99_ms:>9.1f}{r.tpot_p50_ms:>10.2f}{r.e2e_p99_s:>10.2f}{r.output_tok_s:>10,.0f}"
                  f"{r.preemptions:>8,}\n")
    return out.getvalue()


def as_json(results: list[SimBenchResult]) -> list[dict]:
    return [asdict(r) for r in results]
