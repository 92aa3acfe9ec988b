"""GPU timing helpers: CUDA-graph replay timing with a cold L2, and measured copy bandwidth.

Decode steps run inside CUDA graphs in the engine, so kernels are timed the same way: one call
captured, replayed, each replay between CUDA events after the L2 was overwritten (a small KV set
would otherwise be read from cache and look faster than HBM allows).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

L2_FLUSH_BYTES = 256 << 20  # > the H200's 60 MB L2


class Timer:
    def __init__(self, device: str | torch.device = "cuda") -> None:
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def _timed(self, run: Callable[[], object], iters: int) -> float:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for start, end in zip(starts, ends):
            self.flush.zero_()
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3

    def graph_us(self, fn: Callable[[], object], iters: int = 30) -> float:
        """Median µs of one CUDA-graph replay of ``fn`` (cold L2)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # compile / warm up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        return self._timed(graph.replay, iters)

    def eager_us(self, fn: Callable[[], object], iters: int = 20) -> float:
        """Median µs of ``fn`` launched eagerly (for paths with host syncs), cold L2."""
        fn()
        torch.cuda.synchronize()
        return self._timed(fn, iters)


def copy_bandwidth_gbs(device: str | torch.device = "cuda", nbytes: int = 4 << 30) -> float:
    """Device-to-device copy of ``nbytes``: (bytes read + bytes written) / time, in GB/s."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    us = Timer(device).eager_us(lambda: dst.copy_(src), iters=10)
    return 2 * nbytes / (us * 1e-6) / 1e9
