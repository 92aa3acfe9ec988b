"""CUDA graphs of the decode-only forward: one per (batch bucket, decode split count).

A decode step of a small model is a few hundred tiny kernel launches; replaying a captured graph
turns them into one launch. Graphs work on static buffers, so a step copies its host arrays into
pinned staging buffers, then (non-blocking) into the static device buffers, and replays the graph
of the smallest bucket that holds the batch; padding rows have slot -1 (no KV written) and
context 0 (nothing read), and their logits are dropped.

The Triton decode kernel's split-context count is a launch parameter, fixed in a graph; each bucket
is captured once per split count a batch of its size can need, and a step replays the graph with
the count an eager step of the same shape would choose (same kernels, same reduction order).
A speculative verify step runs here too, a row per token (``as_decode_rows`` in
runtime/executor/model_inputs.py), while its tokens fit the largest bucket; its logits come back in
the plan's row order. Mixed or prefill steps run eagerly. Off CUDA the same buffers and buckets run eagerly
("dry run"), which lets the CPU tests (Triton interpreted) check the staging and padding logic.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import torch

from runtime.executor.attention import AttentionBackend, AttentionMetadata
from runtime.executor.model.layers.decoder import CausalLM
from runtime.executor.model_inputs import HostInputs, fill_placeholders


def batch_buckets(max_batch: int) -> list[int]:
    small = [b for b in (1, 2, 4, 8) if b < max_batch]
    return small + list(range(16, max_batch, 16)) + [max_batch]


def split_counts(backend: AttentionBackend, lo: int, hi: int, num_kv_heads: int, max_model_len: int) -> list[int]:
    """Split counts a decode batch of lo..hi sequences can get (powers of two: fewest at hi seqs
    and short contexts, most at lo seqs and the longest context)."""
    if not hasattr(backend, "decode_splits"):
        return [1]
    most = backend.decode_splits(lo, num_kv_heads, max_model_len)
    least = backend.decode_splits(hi, num_kv_heads, 1)
    return [1 << i for i in range(least.bit_length() - 1, most.bit_length())]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None in a dry run (no CUDA)
    logits: torch.Tensor | None  # the static output of this graph


class DecodeGraphs:
    def __init__(self, model: CausalLM, kv_caches: list, backend: AttentionBackend, *, max_batch: int,
                 max_model_len: int, block_size: int, device: torch.device) -> None:
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.device = device
        self.dry_run = device.type != "cuda"
        self.buckets = batch_buckets(max_batch)
        self.max_model_len = max_model_len
        self.num_kv_heads = kv_caches[0][0].shape[2]
        lows = [1] + [b + 1 for b in self.buckets[:-1]]
        self.keys = [(b, s) for lo, b in zip(lows, self.buckets)
                     for s in split_counts(backend, lo, b, self.num_kv_heads, max_model_len)]
        self.max_batch = self.buckets[-1]
        self.max_blocks = -(-max_model_len // block_size)
        b, w = self.max_batch, self.max_blocks
        dev = dict(device=device)
        # ids, positions, slots, context lengths, placeholder rows and their sources, the logits rows
        # in plan order: one [7, b] buffer, one H2D copy per step
        self.d_vec = torch.zeros((7, b), dtype=torch.int64, **dev)
        (self.ids, self.positions, self.slots, self.seq_lens64, self.fill_rows, self.fill_from,
         self.order) = self.d_vec.unbind(0)
        self.identity = np.arange(b, dtype=np.int64)
        self.seq_lens = torch.zeros(b, dtype=torch.int32, **dev)  # the kernels read int32
        self.block_table = torch.zeros((b, w), dtype=torch.int32, **dev)
        self.query_start = torch.arange(b + 1, dtype=torch.int32, **dev)
        self.rows = torch.arange(b, dtype=torch.int64, **dev)  # every decode token samples
        # host staging (pinned on CUDA), two sets used in turn: with overlapped steps the host fills
        # step n+1's set while step n's copy may still be queued behind step n-1 on the GPU
        pin = not self.dry_run
        self.staging = [(torch.zeros((7, b), dtype=torch.int64, pin_memory=pin),
                         torch.zeros((b, w), dtype=torch.int32, pin_memory=pin)) for _ in range(2)]
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.replays = 0

    def _meta(self, batch: int, splits: int) -> AttentionMetadata:
        n = self.max_model_len
        return AttentionMetadata(
            slot_mapping=self.slots[:batch], query_start_loc=self.query_start[: batch + 1],
            seq_lens=self.seq_lens[:batch], block_tables=self.block_table[:batch], num_decodes=batch,
            max_query_len=1, max_seq_len=n, query_lens_cpu=[1] * batch, seq_lens_cpu=[n] * batch,
            query_start_loc_cpu=list(range(batch + 1)), decode_splits=splits)

    def _forward(self, batch: int, splits: int) -> torch.Tensor:
        return self.model(self.ids[:batch], self.positions[:batch], self.kv_caches, self._meta(batch, splits),
                          self.backend, self.rows[:batch])

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (bucket, split count), largest batch first so later graphs fit in the pool."""
        self.slots.fill_(-1)
        self.seq_lens.zero_()
        if self.dry_run:
            self.graphs = {key: _Graph(None, None) for key in self.keys}
            return
        pool = None
        side = torch.cuda.Stream(self.device)
        for batch, splits in sorted(self.keys, reverse=True):
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up: Triton compiles, allocator settles
                self._forward(batch, splits)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(batch, splits)
            pool = graph.pool()
            self.graphs[(batch, splits)] = _Graph(graph, logits)
        torch.cuda.synchronize(self.device)

    def supports(self, host: HostInputs) -> bool:
        n = len(host.seq_lens)
        return (host.decode_only and 0 < n <= self.max_batch and host.block_table.shape[1] <= self.max_blocks
                and int(host.seq_lens.max()) <= self.max_model_len)

    @torch.inference_mode()
    def run(self, host: HostInputs, previous_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[n, vocab]`` of a decode-only step, in ``host.logits_indices`` order (a view of
        static memory when that is the rows' own order: use before the next run). ``previous_ids``:
        the previous launch's sampled ids, when ``host`` has placeholders."""
        n = len(host.seq_lens)
        batch = self.buckets[bisect.bisect_left(self.buckets, n)]
        choose = getattr(self.backend, "decode_splits", None)
        splits = choose(n, self.num_kv_heads, int(host.seq_lens.max())) if choose else 1
        h_vec, h_table = self.staging[self.replays % 2]
        vec = h_vec.numpy()
        vec[0, :n] = host.input_ids
        vec[1, :n] = host.positions
        vec[2, :n] = host.slot_mapping
        vec[3, :n] = host.seq_lens
        vec[:, n:batch] = 0
        vec[2, n:batch] = -1  # padding rows write no KV
        p = len(host.fill_rows)
        vec[4, :p] = host.fill_rows
        vec[5, :p] = host.fill_from
        rows = host.logits_indices  # (a plain decode step's are the rows' own order)
        permuted = host.rows_per_sample is not None and not np.array_equal(rows, self.identity[:n])
        if permuted:
            vec[6, :n] = rows
        w = host.block_table.shape[1]
        h_table.numpy()[:n, :w] = host.block_table
        self.d_vec[:, :batch].copy_(h_vec[:, :batch], non_blocking=True)
        self.block_table[:batch].copy_(h_table[:batch], non_blocking=True)
        self.seq_lens[:batch].copy_(self.seq_lens64[:batch])
        fill_placeholders(self.ids, self.fill_rows[:p], self.fill_from[:p], previous_ids)
        g = self.graphs[(batch, splits)]
        self.replays += 1
        if g.graph is None:
            logits = self._forward(batch, splits)[:n]
        else:
            g.graph.replay()
            logits = g.logits[:n]
        return logits.index_select(0, self.order[:n]) if permuted else logits
