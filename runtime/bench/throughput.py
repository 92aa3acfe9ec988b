"""``minivllm bench throughput``: offline throughput of the engine and of HF transformers, side by
side in one run on the same prompts.

Workload (seeded): ``num_prompts`` prompts of random token ids, input length uniform in
``input_len``, output length uniform in ``output_len``, eos ignored, all arriving at once; greedy.
With ``sampling`` (``temperature``, ``top_p``, ``top_k``, ``min_p``) the engine runs the same
workload a second time, sampled, and the report puts it beside greedy (real traffic samples).
Figures: output tokens per second (requested tokens only, for every peer), ratios to the best HF
peer, and the engine overhead = share of step wall time outside the model forward (scheduling,
input staging, sampling, commit), overall and over the steps with about 32 running requests; the
bandwidth limit (runtime/bench/roofline.py) and the prefill-bearing steps' FLOP/s against the measured
dense matmul peak (runtime/bench/flops.py, runtime/bench/gemm_peak.py).
"""

from __future__ import annotations

import gc
import io
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from runtime.bench.flops import FlopCounter, PrefillCompute, prefill_compute
from runtime.bench.gemm_peak import measure_gemm_peak
from runtime.bench.hf_peers import PeerResult
from runtime.bench.roofline import ByteCounter, Roofline, kv_bytes_per_token, measure_bandwidth, roofline, weight_bytes


@dataclass
class Workload:
    prompts: list[list[int]]
    outputs: list[int]

    @classmethod
    def random(cls, num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int,
               seed: int = 0) -> Workload:
        rng = np.random.default_rng(seed)
        ins = rng.integers(input_len[0], input_len[1] + 1, size=num_prompts)
        outs = rng.integers(output_len[0], output_len[1] + 1, size=num_prompts)
        prompts = [rng.integers(0, vocab, size=int(n)).tolist() for n in ins]
        return cls(prompts, [int(n) for n in outs])


@dataclass
class EngineResult:
    seconds: float
    output_tokens: int
    input_tokens: int
    steps: int
    overhead: float  # share of step time outside the forward, all steps
    overhead_at_32: float | None  # same over steps scheduling 28..36 sequences
    steps_at_32: int
    step_ms_at_32: float | None
    breakdown_ms: dict[str, float] = field(default_factory=dict)  # mean per step
    cpu_seconds: float = 0.0  # process CPU time (all threads): a check on a shared machine
    load_avg: float = 0.0  # 1-minute load average at the end
    bytes_read: ByteCounter | None = None  # what the steps had to read (roofline)
    prefill_flops: FlopCounter | None = None  # what the prefill-bearing steps computed

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds


def request_params(max_tokens: int, sampling: dict | None = None):
    """The benchmark's requests: eos ignored, greedy unless ``sampling`` says otherwise."""
    from traces.params import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **(sampling or {"temperature": 0.0}))


def warm_up(parts, workload: Workload, sampling: dict | None = None) -> None:
    """Untimed: a prefill, decodes, and a mixed step (decode + prefill chunk), so one-time costs
    (allocator growth, kernel compilation of every path) stay out of the measurement."""
    core = parts.core()
    loop = parts.loop(core, lambda: 0.0)
    params = request_params(8, sampling)
    core.add_request(workload.prompts[0][:32], params, 0.0)
    loop.step()
    loop.step()
    core.add_request(workload.prompts[-1][:300], params, 0.0)
    while core.has_unfinished() or loop.busy:
        loop.step()
    parts.runner.reset()  # the warm-up's sampling streams: not the timed run's


def stage(what: str) -> None:
    """One line on stderr as a silent stage starts (a model load, a warm-up, a probe)."""
    print(f"{what} …", file=sys.stderr, flush=True)


def run_engine(parts, workload: Workload, progress: bool = True, sampling: dict | None = None) -> EngineResult:
    """All requests arrive at once; step until done. Timing excludes a short warm-up."""
    from tqdm import tqdm

    runner = parts.runner
    stage("warming up the engine" + (" (sampled)" if sampling else ""))
    warm_up(parts, workload, sampling)
    core = parts.core()  # a fresh core: the timed run starts with an empty prefix cache
    runner.stats.__init__()
    runner.record_steps = True
    for prompt, n in zip(workload.prompts, workload.outputs):
        core.add_request(prompt, request_params(n, sampling), 0.0)
    bar = tqdm(total=len(workload.prompts), desc="minivllm" + (" sampled" if sampling else ""), unit="req",
               disable=not progress)
    spec = parts.loaded.spec
    counter = ByteCounter(weight_bytes(runner.model),
                          kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_dim, runner.dtype))
    flops = FlopCounter.of(spec)
    walls: list[float] = []
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    loop = parts.loop(core, lambda: time.perf_counter() - t0)
    while core.has_unfinished() or loop.busy:
        for out in loop.step():
            walls.append(out.result.duration)
            counter.add_step(out.plan.spans)
            flops.add_step(out.plan.spans, out.result.duration)
            bar.update(sum(1 for d in out.deltas if d.finished))
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - c0
    bar.close()
    st = runner.stats
    fwd = np.array([f for _, _, _, f in st.per_step])
    seqs = np.array([n for n, _, _, _ in st.per_step])
    wall = np.array(walls)
    at32 = (seqs >= 28) & (seqs <= 36)
    n = max(st.steps, 1)
    breakdown = {"schedule+commit": (wall.sum() - st.total) / n * 1e3, "prepare": st.prepare / n * 1e3,
                 "forward": st.forward / n * 1e3, "sample": st.sample / n * 1e3}
    return EngineResult(
        seconds, sum(workload.outputs), sum(map(len, workload.prompts)), st.steps,
        float(1 - fwd.sum() / wall.sum()),
        float(1 - fwd[at32].sum() / wall[at32].sum()) if at32.any() else None,
        int(at32.sum()), float(wall[at32].mean() * 1e3) if at32.any() else None, breakdown, cpu_seconds,
        os.getloadavg()[0], counter, flops)


@dataclass
class ThroughputReport:
    setup: dict
    engine: EngineResult
    peers: list[PeerResult]
    roofline: Roofline | None = None
    sampled: EngineResult | None = None  # the same workload sampled with ``setup["sampling"]``
    compute: PrefillCompute | None = None  # prefill FLOPs against the measured matmul peak

    def sampled_vs_greedy(self) -> float | None:
        return self.sampled.output_tok_s / self.engine.output_tok_s if self.sampled is not None else None

    def best_peer(self) -> PeerResult | None:
        return max(self.peers, key=lambda p: p.output_tok_s, default=None)

    def table(self) -> str:
        out = io.StringIO()
        s = self.setup
        out.write(f"model {s['model']} ({s['dtype']}, {s['device']}, attention {s['attention_backend']}); "
                  f"{s['num_prompts']} prompts, input {s['input_len'][0]}-{s['input_len'][1]}, "
                  f"output {s['output_len'][0]}-{s['output_len'][1]} (seed {s['seed']}), ignore eos, greedy\n")
        best = self.best_peer()
        out.write(f"{'engine':<44}{'time s':>9}{'out tok/s':>11}{'vs best HF':>12}{'cpu s':>9}{'load':>6}\n")
        e = self.engine
        rows = [("minivllm", e.seconds, e.output_tok_s, e.cpu_seconds, e.load_avg)]
        if self.sampled is not None:
            sm = self.sampled
            rows.append(("minivllm sampled", sm.seconds, sm.output_tok_s, sm.cpu_seconds, sm.load_avg))
        rows += [(p.name, p.seconds, p.output_tok_s, p.cpu_seconds, p.load_avg) for p in self.peers]
        for name, sec, tps, cpu, load in rows:
            ratio = f"{tps / best.output_tok_s:.2f}x" if best else "-"
            out.write(f"{name:<44}{sec:>9.1f}{tps:>11.1f}{ratio:>12}{cpu:>9.1f}{load:>6.1f}\n")
        out.write(f"output tokens {e.output_tokens} (input {e.input_tokens}); {e.steps} engine steps\n")
        at32 = (f"{e.overhead_at_32:.1%} over the {e.steps_at_32} steps with 28-36 sequences "
                f"({e.step_ms_at_32:.1f} ms/step)" if e.overhead_at_32 is not None else "n/a")
        if s["device"].startswith("cuda"):
            out.write("engine overhead: the forward runs asynchronously here; `minivllm bench profile` splits a step\n")
        else:
            out.write(f"engine overhead (step time outside the forward): {e.overhead:.1%} overall; {at32}\n")
        out.write("mean ms/step: " + ", ".join(f"{k} {v:.2f}" for k, v in e.breakdown_ms.items()) + "\n")
        if self.sampled is not None:
            out.write(f"sampled ({describe_sampling(s['sampling'])}, {s['sampler']} sampler): "
                      f"{self.sampled_vs_greedy():.1%} of greedy's tok/s; mean ms/step: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in self.sampled.breakdown_ms.items()) + "\n")
        if self.roofline is not None:
            out.write(self.roofline.describe() + "\n")
        if self.compute is not None:
            out.write(self.compute.describe() + "\n")
        for p in self.peers:
            if p.note:
                out.write(f"  {p.name}: {p.note}\n")
        return out.getvalue()

    def as_json(self) -> dict:
        best = self.best_peer()
        return {
            "setup": self.setup,
            "engine": {**asdict(self.engine), "output_tok_s": self.engine.output_tok_s},
            "sampled": None if self.sampled is None else {**asdict(self.sampled),
                                                          "output_tok_s": self.sampled.output_tok_s},
            "sampled_vs_greedy": self.sampled_vs_greedy(),
            "peers": [{**asdict(p), "output_tok_s": p.output_tok_s} for p in self.peers],
            "speedup_vs_best_hf": self.engine.output_tok_s / best.output_tok_s if best else None,
            "roofline": self.roofline.as_dict() if self.roofline is not None else None,
            "prefill_compute": self.compute.as_dict() if self.compute is not None else None,
        }


def _run_peer(hf_peers, peer: str, hf, workload: Workload, device, static_batch: int, progress: bool):
    if peer == "single":
        return hf_peers.run_single(hf, workload.prompts, workload.outputs, device, progress)
    if peer == "static":
        return hf_peers.run_static(hf, workload.prompts, workload.outputs, device, static_batch, progress)
    if peer == "cb":
        if not hf_peers.continuous_batching_available(hf):
            print("note: this transformers has no continuous batching; skipping the cb peer")
            return None
        return hf_peers.run_continuous(hf, workload.prompts, workload.outputs, device, progress)
    raise ValueError(f"unknown peer {peer!r} (single, static, cb)")


def describe_sampling(sampling: dict) -> str:
    return ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in sampling.items())


def run(model: str | None, *, peers: list[str], num_prompts: int = 64, input_len=(32, 256),
        output_len=(16, 256), static_batch: int = 16, progress: bool = True, sampling: dict | None = None,
        **options) -> ThroughputReport:
    """``options``: engine options (runtime/executor/setup.py); ``seed`` seeds the workload too;
    ``sampling``: SamplingParams fields of a second, sampled run of the engine."""
    import torch

    from runtime.bench import hf_peers
    from runtime.executor.setup import build_engine

    seed = options.get("seed", 0)
    # no device sync inside a step: the host prepares sampling while the GPU runs the forward (on
    # CUDA the per-phase split comes from `minivllm bench profile`, which does synchronise)
    stage(f"loading model {model or 'SmolLM2-135M-Instruct (default)'}")
    parts = build_engine(model, sync_timing=False, **options)
    loaded = parts.loaded
    workload = Workload.random(num_prompts, input_len, output_len, loaded.spec.vocab_size, seed)
    setup = {"model": loaded.identity, "device": str(loaded.device), "dtype": str(loaded.dtype).removeprefix("torch."),
             "attention_backend": parts.runner.backend.name, "num_prompts": num_prompts,
             "input_len": list(input_len), "output_len": list(output_len), "seed": seed,
             "num_blocks": parts.runner.num_blocks, "block_size": parts.runner.block_size,
             "max_num_seqs": parts.config.scheduler.max_num_seqs,
             "max_num_batched_tokens": parts.config.scheduler.max_num_batched_tokens,
             "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
             "sampler": parts.runner.sampler.backend, "sampling": sampling}
    engine = run_engine(parts, workload, progress)
    sampled = run_engine(parts, workload, progress, sampling) if sampling else None
    if sampled is not None:
        print(f"minivllm sampled ({describe_sampling(sampling)}): {sampled.output_tok_s:,.1f} output tok/s = "
              f"{sampled.output_tok_s / engine.output_tok_s:.1%} of greedy", flush=True)
    device, dtype = loaded.device, loaded.dtype
    del parts  # free the KV pool before HF allocates its caches (and before the bandwidth probe)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    stage(f"measuring the copy bandwidth of {device}")
    limit = roofline(engine.bytes_read, measure_bandwidth(device), engine.seconds)
    setup["copy_bandwidth_gbs"] = limit.bandwidth_gbs
    print(f"minivllm: {engine.output_tok_s:,.1f} output tok/s ({engine.seconds:.2f} s); {limit.describe()}",
          flush=True)
    stage(f"measuring the dense matmul peak of {device} ({setup['dtype']})")
    compute = prefill_compute(engine.prefill_flops, measure_gemm_peak(device, dtype))
    setup["gemm_peak_tflops"] = compute.peak_tflops
    print(f"minivllm: {compute.describe()}", flush=True)
    results: list[PeerResult] = []
    if peers:
        import transformers

        setup["transformers"] = transformers.__version__
        stage(f"loading the HF transformers peer ({', '.join(peers)})")
        hf = hf_peers.load_hf_model(loaded, device, dtype)
        del loaded
        stage("warming up the HF peer")
        hf_peers.warmup(hf, device)
        for peer in peers:
            try:
                result = _run_peer(hf_peers, peer, hf, workload, device, static_batch, progress)
            except Exception as e:  # a peer that breaks is reported, not allowed to lose the run
                print(f"note: HF peer {peer!r} failed: {e!r}")
                setup.setdefault("peer_errors", {})[peer] = repr(e)
                continue
            if result is not None:
                results.append(result)
    return ThroughputReport(setup, engine, results, limit, sampled, compute)
