"""``minivllm bench profile``: where a step's time goes — schedule, metadata, forward, sampling, commit.

Runs the throughput workload through EngineCore + ModelRunner with the phases timed separately
(``schedule`` and ``commit`` in the core; ``metadata`` = building the step's inputs, ``forward``
= the model (synchronised on CUDA, CUDA-graph replay for decode steps), ``sampling`` = sampler
incl. the token D2H), split into decode-only steps and steps that carry prefill.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field

import numpy as np

PHASES = ("schedule", "metadata", "forward", "sampling", "commit")


@dataclass
class StepProfile:
    setup: dict
    # per step: phase -> seconds, plus whether it was decode-only
    rows: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    decode_only: list[bool] = field(default_factory=list)

    def table(self) -> str:
        out = io.StringIO()
        s = self.setup
        out.write(f"model {s['model']} ({s['dtype']}, {s['device']}, attention {s['attention_backend']}, "
                  f"cuda graphs {'on' if s['cuda_graphs'] else 'off'}); {s['num_prompts']} prompts\n")
        dec = np.array(self.decode_only)
        for label, mask in (("all steps", np.ones_like(dec)), ("decode-only steps", dec),
                            ("steps with prefill", ~dec)):
            n = int(mask.sum())
            if not n:
                continue
            per = {p: float(np.asarray(self.rows[p])[mask].mean() * 1e3) for p in PHASES}
            total = sum(per.values())
            out.write(f"{label} ({n}): {total:.2f} ms/step\n")
            for p in PHASES:
                out.write(f"  {p:<10}{per[p]:>9.3f} ms {per[p] / total:>7.1%}\n")
        return out.getvalue()

    def as_json(self) -> dict:
        return {"setup": self.setup, "phases_ms": {p: [x * 1e3 for x in v] for p, v in self.rows.items()},
                "decode_only": self.decode_only}


def run(model: str | None, *, num_prompts: int = 256, input_len=(100, 1024), output_len=(512, 512),
        progress: bool = True, **options) -> StepProfile:
    from tqdm import tqdm

    from runtime.bench.throughput import Workload, stage, warm_up
    from runtime.executor.setup import build_engine
    from traces.params import SamplingParams

    stage(f"loading model {model or 'SmolLM2-135M-Instruct (default)'}")
    parts = build_engine(model, sync_timing=True, **options)
    runner, loaded = parts.runner, parts.loaded
    seed = options.get("seed", 0)
    workload = Workload.random(num_prompts, input_len, output_len, loaded.spec.vocab_size, seed)
    prof = StepProfile({"model": loaded.identity, "device": str(loaded.device),
                        "dtype": str(loaded.dtype).removeprefix("torch."), "attention_backend": runner.backend.name,
                        "cuda_graphs": runner.graphs is not None, "num_prompts": num_prompts,
                        "input_len": list(input_len), "output_len": list(output_len), "seed": seed})
    stage("warming up the engine")
    warm_up(parts, workload)
    core = parts.core()
    for prompt, n in zip(workload.prompts, workload.outputs):
        core.add_request(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), 0.0)
    st = runner.stats
    bar = tqdm(total=num_prompts, desc="profile", unit="req", disable=not progress)
    t_start = time.perf_counter()
    while core.has_unfinished():
        t0 = time.perf_counter()
        plan = core.schedule(t0 - t_start)
        t1 = time.perf_counter()
        before = (st.prepare, st.forward, st.sample)
        result = runner.execute(plan, core.requests)
        t2 = time.perf_counter()
        deltas = core.commit(plan, result, t1 - t_start)
        t3 = time.perf_counter()
        prep, fwd, samp = (a - b for a, b in zip((st.prepare, st.forward, st.sample), before))
        r = prof.rows
        r["schedule"].append(t1 - t0)
        r["metadata"].append(prep)
        r["forward"].append(fwd)
        r["sampling"].append(samp + max(0.0, (t2 - t1) - (prep + fwd + samp)))  # + runner bookkeeping
        r["commit"].append(t3 - t2)
        prof.decode_only.append(all(s.num_tokens == 1 for s in plan.spans))
        bar.update(sum(1 for d in deltas if d.finished))
    bar.close()
    return prof
