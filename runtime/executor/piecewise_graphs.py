"""Piecewise CUDA graphs for prefill and mixed steps: all but the attention core replays from graphs.

Steps with a prefill chunk run eagerly (their attention shapes vary), and for a small model such a
step is host-bound: ~12 launches per layer, and on the H200 host one Triton launch costs ~40 µs of
Python (a torch op ~10-20 µs, a graph replay ~5 µs), so a 2,048-token SmolLM2 step spent ~13 ms
launching ~3 ms of GPU work. As vLLM does, the forward is captured in L + 1 pieces per padded
token count (bucket), split at each layer's attention core. A step copies its inputs into static
buffers, replays piece 0, runs layer 0's attention eagerly on the real tokens (with the step's own
metadata), replays piece 1, and so on; the last piece ends with the logits of ``min(bucket, max_seqs)``
padded rows (a step has no more logits rows than tokens; a speculating decode has one per position,
so with speculation the runner asks for ``max_num_seqs * (1 + K)`` rows).

Padding tokens have slot -1 (no KV written); every graphed op is row-wise, and attention runs on
the real tokens only, so padding never reaches a real token. Off CUDA the same buffers and pieces
run eagerly ("dry run"), so the CPU tests check the padding and buffer logic.
"""

from __future__ import annotations

import bisect

import torch

from runtime.executor.attention import AttentionBackend, AttentionMetadata
from runtime.executor.model.layers.decoder import CausalLM
from runtime.executor.model_inputs import HostInputs, fill_placeholders
from traces.step_padding import token_buckets


class _Splitter:
    """The attention backend the model sees while pieces are captured: KV stores are captured,
    each attention core copies its queries to the static ``q`` buffer, closes the current piece and
    opens the next. ``run_attention`` (dry run) runs the core in line instead."""

    def __init__(self, backend: AttentionBackend, q: torch.Tensor, out: torch.Tensor, pool,
                 run_attention: bool = False) -> None:
        self.backend, self.name = backend, backend.name
        self.q, self.out, self.pool, self.run_attention = q, out, pool, run_attention
        self.meta: AttentionMetadata | None = None
        self.pieces: list[torch.cuda.CUDAGraph] = []
        self.graph: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.graph.capture_begin(pool=self.pool)

    def end(self) -> None:
        self.graph.capture_end()
        self.pieces.append(self.graph)

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        self.backend.store_kv(k, v, k_cache, v_cache, slot_mapping)

    def forward(self, q, k_cache, v_cache, meta, scale) -> torch.Tensor:
        out = self.out[: q.shape[0]]
        if self.run_attention:
            n = self.meta.query_start_loc_cpu[-1]
            self.backend.forward(q[:n], k_cache, v_cache, self.meta, scale, out=out[:n])
        else:  # one static query buffer for every layer and bucket: the qkv outputs stay transient
            self.q[: q.shape[0]].copy_(q)
            self.end()
            self.begin()
        return out


class _Bucket:
    def __init__(self, pieces: list, logits: torch.Tensor) -> None:
        self.pieces, self.logits = pieces, logits


class PiecewiseGraphs:
    def __init__(self, model: CausalLM, kv_caches: list, backend: AttentionBackend, *, max_tokens: int,
                 max_seqs: int, device: torch.device) -> None:
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.device = device
        self.dry_run = device.type != "cuda"
        self.buckets = token_buckets(max_tokens)
        self.max_tokens, self.max_seqs = self.buckets[-1], max_seqs
        spec = model.spec
        dev = dict(device=device)
        t = self.max_tokens
        w = max(t, max_seqs)
        # ids, positions, slots, logits rows, placeholder rows and their sources: one [6, w] buffer,
        # one H2D copy per step from pinned staging (two sets used in turn, as in cuda_graphs.py)
        self.d_vec = torch.zeros((6, w), dtype=torch.int64, **dev)
        self.ids, self.positions, self.slots, self.logits_rows, self.fill_rows, self.fill_from = self.d_vec.unbind(0)
        pin = not self.dry_run
        self.staging = [torch.zeros((6, w), dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        # the attention cores' queries (written by the pieces) and outputs (read by them)
        dtype = model.embed_tokens.weight.dtype
        self.q = torch.zeros((t, spec.num_heads, spec.head_dim), dtype=dtype, **dev)
        self.out = torch.zeros_like(self.q)
        self.scales = [layer.self_attn.scale for layer in model.layers]
        self.graphs: dict[int, _Bucket] = {}
        self.replays = 0

    def _forward(self, splitter: _Splitter, tokens: int, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(self.ids[:tokens], self.positions[:tokens], self.kv_caches, meta, splitter,
                          self.logits_rows[: self.rows_of(tokens)])

    def rows_of(self, tokens: int) -> int:
        """The logits rows of a bucket of ``tokens``."""
        return min(tokens, self.max_seqs)

    def _capture_meta(self, tokens: int) -> AttentionMetadata:
        """Only ``slot_mapping`` is read inside the pieces (by the KV store)."""
        slots = self.slots[:tokens]
        return AttentionMetadata(slot_mapping=slots, query_start_loc=slots, seq_lens=slots, block_tables=slots,
                                 num_decodes=0, max_query_len=tokens, max_seq_len=tokens,
                                 query_lens_cpu=[tokens], seq_lens_cpu=[tokens])

    @torch.inference_mode()
    def capture(self) -> None:
        """Every bucket, largest first (later captures reuse the pool); warm-up runs compile first."""
        if self.dry_run:
            return
        self.slots.fill_(-1)
        self.logits_rows.zero_()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for tokens in sorted(self.buckets, reverse=True):
                meta = self._capture_meta(tokens)
                warm = _Splitter(self.backend, self.q, self.out, pool)
                warm.end = warm.begin = lambda: None  # an uncaptured run: compiles the pieces' kernels
                self._forward(warm, tokens, meta)
                splitter = _Splitter(self.backend, self.q, self.out, pool)
                splitter.begin()
                logits = self._forward(splitter, tokens, meta)
                splitter.end()
                self.graphs[tokens] = _Bucket(splitter.pieces, logits)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)

    def supports(self, host: HostInputs) -> bool:
        return host.num_tokens <= self.max_tokens and len(host.logits_indices) <= self.max_seqs

    @torch.inference_mode()
    def run(self, host: HostInputs, meta: AttentionMetadata, previous_ids: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[len(host.logits_indices), vocab]`` (a view of static memory: use before the next run)."""
        n, rows = host.num_tokens, len(host.logits_indices)
        tokens = self.buckets[bisect.bisect_left(self.buckets, n)]
        staging = self.staging[self.replays % 2]
        vec = staging.numpy()
        vec[0, :n] = host.input_ids
        vec[1, :n] = host.positions
        # padding tokens: token 0 at position 0; never a stale id (a placeholder from an earlier
        # step would index outside the embedding: a device-side assert on CUDA)
        vec[0:2, n:tokens] = 0
        vec[2, :n] = host.slot_mapping
        vec[2, n:tokens] = -1  # padding tokens write no KV
        vec[3, :rows] = host.logits_indices
        vec[3, rows:self.rows_of(tokens)] = 0
        p = len(host.fill_rows)
        vec[4, :p] = host.fill_rows
        vec[5, :p] = host.fill_from
        width = max(tokens, self.max_seqs)
        self.d_vec[:, :width].copy_(staging[:, :width], non_blocking=True)
        fill_placeholders(self.ids, self.fill_rows[:p], self.fill_from[:p], previous_ids)
        self.replays += 1
        if self.dry_run:
            splitter = _Splitter(self.backend, self.q, self.out, None, run_attention=True)
            splitter.meta = meta
            return self._forward(splitter, tokens, self._capture_meta(tokens))[:rows]
        bucket = self.graphs[tokens]
        # per layer only the graph piece and the attention core's launches (a small model's step is host-bound):
        # the core, prepared once for the step, writes straight into the static buffer the next piece reads
        attend = self.backend.prepare(meta, self.q[:n], self.out[:n], *self.kv_caches[0])
        for piece, (k_cache, v_cache), scale in zip(bucket.pieces[:-1], self.kv_caches, self.scales, strict=True):
            piece.replay()
            attend(k_cache, v_cache, scale)
        bucket.pieces[-1].replay()
        return bucket.logits[:rows]
