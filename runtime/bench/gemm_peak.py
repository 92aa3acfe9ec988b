"""The machine's dense matmul peak for a dtype and device, measured: large square matmuls (8192 on
CUDA, timed between CUDA events as the decode kernels are: runtime/bench/gpu_timing.py; 2048 on the
CPU, the best of a few, so it stays under a couple of seconds), in FLOP/s."""

from __future__ import annotations

import time

import torch


def measure_gemm_peak(device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    if device.type == "cuda":
        from runtime.bench.gpu_timing import Timer

        seconds = Timer(device).eager_us(lambda: torch.matmul(a, b, out=out), iters=max(repeats, 10)) * 1e-6
    else:
        torch.matmul(a, b, out=out)  # warm-up: library selection, first-touch
        seconds = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.matmul(a, b, out=out)
            seconds = min(seconds, time.perf_counter() - t)
    return 2 * n**3 / seconds
