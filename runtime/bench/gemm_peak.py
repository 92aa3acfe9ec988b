"""The machine's dense matmul peak for a dtype and device, measured: the best of a few large square
matmuls (8192 on CUDA, 2048 on the CPU so it stays under a couple of seconds), in FLOP/s."""

from __future__ import annotations

import time

import torch


def measure_gemm_peak(device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    cuda = device.type == "cuda"
    n = 8192 if cuda else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    iters = 10 if cuda else 1
    torch.matmul(a, b, out=out)  # warm-up: library selection, first-touch
    if cuda:
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                torch.matmul(a, b, out=out)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            torch.matmul(a, b, out=out)
            seconds = time.perf_counter() - t
        best = min(best, seconds / iters)
    return 2 * n**3 / best
