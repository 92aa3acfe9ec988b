"""Where a prefill step's GPU time goes: torch profiler over one 2048-token prefill step.

``python -m runtime.bench.prefill_probe [--model-shape qwen3-0.6b]`` (CUDA); prints the top kernels.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    from runtime.bench.throughput import Workload, warm_up
    from runtime.executor.setup import build_engine
    from traces.params import SamplingParams

    p = argparse.ArgumentParser()
    p.add_argument("--model-shape", default="qwen3-0.6b")
    args = p.parse_args(argv)
    parts = build_engine(f"random:{args.model_shape}", device="cuda", dtype="bfloat16", sync_timing=True)
    wl = Workload.random(4, (512, 512), (4, 4), parts.loaded.spec.vocab_size)
    warm_up(parts, wl)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    times = []
    for rep in range(4):
        core = parts.core()
        for prompt in Workload.random(4, (512, 512), (2, 2), parts.loaded.spec.vocab_size, seed=rep + 1).prompts:
            core.add_request(prompt, params, 0.0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        if rep == 3:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                out = core.step(0.0, parts.runner)
                torch.cuda.synchronize()
        else:
            out = core.step(0.0, parts.runner)
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        assert out.plan.num_scheduled_tokens == 2048
    print(f"2048-token prefill step: {np.round(np.array(times) * 1e3, 2)} ms (last one under the profiler)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
