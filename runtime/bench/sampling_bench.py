"""Sampling micro-benchmark: three ways to draw one token per row, µs per step and bytes moved.

* ``per-seq .item()``: a loop over rows, each with torch ops on the device, its own torch
  Generator and an ``.item()`` (one sync per row) — the naive baseline;
* ``full-probs D2H``: softmax and top-p on the device, the whole [B, V] probability matrix copied
  to the host, the inverse CDF in numpy;
* ``gpu-native``: runtime.executor.sampling (host builds params + one uniform per row, one H2D; filters and
  inverse CDF on the device; one D2H of [B] ids), timed including ``SamplingBatch.build``: with the
  torch ops (a sort per row for top-p) and with the sorting-free Triton kernel (CUDA only);
* ``gpu-native greedy``: the same API on an all-greedy batch (one argmax).

Runs on CPU or CUDA: ``python -m runtime.bench.sampling_bench --device cuda --batch 256 --vocab 151936``.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import numpy as np
import torch

from runtime.executor.sampling import Sampler, SamplingBatch, request_rng
from traces.params import SamplingParams

TEMPERATURE, TOP_P = 0.8, 0.95


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_seq_item(logits: torch.Tensor, gens: list[torch.Generator]) -> list[int]:
    out = []
    for i in range(logits.shape[0]):
        probs = torch.softmax(logits[i].float() / TEMPERATURE, -1)
        vals, idx = torch.sort(probs, descending=True)
        keep = (torch.cumsum(vals, 0) - vals) < TOP_P
        vals = vals * keep
        out.append(int(idx[torch.multinomial(vals, 1, generator=gens[i])].item()))
    return out


def _full_probs_d2h(logits: torch.Tensor, rngs: list[random.Random]) -> list[int]:
    probs = torch.softmax(logits.float() / TEMPERATURE, -1)
    vals, idx = torch.sort(probs, dim=-1, descending=True)
    drop = (torch.cumsum(vals, -1) - vals) >= TOP_P
    probs.scatter_(1, idx, vals.masked_fill(drop, 0.0))  # top-p on the device
    host = probs.cpu().numpy()  # the whole [B, V] matrix crosses to the host
    cdf = np.cumsum(host, 1, dtype=np.float64)
    u = np.array([r.random() for r in rngs])[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(1), host.shape[1] - 1).tolist()


def bench_sampling(device: str | torch.device = "cpu", batch: int = 64, vocab: int = 32000,
                   steps: int = 20, dtype: torch.dtype = torch.float32,
                   max_seconds: float = 20.0) -> list[dict]:
    """µs per step and bytes per step of each method on [batch, vocab] logits."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(batch, vocab, generator=gen) * 3).to(device=device, dtype=dtype)
    itemsize = 8
    sampled = [SamplingParams(temperature=TEMPERATURE, top_p=TOP_P)] * batch
    greedy = [SamplingParams(temperature=0.0)] * batch
    rngs = [request_rng(0, i, None) for i in range(batch)]
    samplers = {"torch": Sampler(backend="torch"), "triton": Sampler(backend="triton")}
    gens = [torch.Generator(device=device).manual_seed(i) for i in range(batch)]

    def native(params: list[SamplingParams], backend: str = "torch") -> Callable[[], list[int]]:
        sampler = samplers[backend]
        return lambda: sampler.sample(logits, SamplingBatch.build(params, rngs, None, device)).token_ids

    def h2d(params: list[SamplingParams]) -> int:
        return SamplingBatch.build(params, rngs, None, device).h2d_bytes

    methods: list[tuple[str, Callable[[], list[int]], int, int, int]] = [  # name, fn, D2H, H2D, syncs
        ("per-seq .item()", lambda: _per_seq_item(logits, gens), batch * itemsize, 0, batch),
        ("full-probs D2H", lambda: _full_probs_d2h(logits, rngs), batch * vocab * 4, 0, 1),
        ("gpu-native", native(sampled), batch * itemsize, h2d(sampled), 1),
        ("gpu-native greedy", native(greedy), batch * itemsize, h2d(greedy), 1),
    ]
    if device.type == "cuda":
        methods.insert(3, ("gpu-native triton", native(sampled, "triton"), batch * itemsize, h2d(sampled), 1))
    rows = []
    for name, fn, d2h, h2d_bytes, syncs in methods:
        fn()  # warm-up (allocator, kernels)
        _sync(device)
        n, start = 0, time.perf_counter()
        while n < steps and (n < 2 or time.perf_counter() - start < max_seconds):
            fn()
            n += 1
        _sync(device)
        us = (time.perf_counter() - start) / n * 1e6
        rows.append({"method": name, "device": str(device), "batch": batch, "vocab": vocab,
                     "us_per_step": round(us, 1), "d2h_bytes": d2h, "h2d_bytes": h2d_bytes,
                     "syncs": syncs, "steps": n})
    return rows


def report(rows: list[dict]) -> str:
    lines = [f"{'method':<20}{'device':>8}{'batch':>7}{'vocab':>8}{'µs/step':>12}{'D2H B':>13}"
             f"{'H2D B':>8}{'syncs':>7}"]
    for r in rows:
        lines.append(f"{r['method']:<20}{r['device']:>8}{r['batch']:>7}{r['vocab']:>8}"
                     f"{r['us_per_step']:>12,.1f}{r['d2h_bytes']:>13,}{r['h2d_bytes']:>8,}{r['syncs']:>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, help="torch CPU threads (1 avoids stalls on a busy CPU)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [r for b in args.batch for v in args.vocab for r in bench_sampling(args.device, b, v, args.steps)]
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
