"""``TritonAttentionBackend``: the ``triton`` attention backend (runtime/executor/attention.py's protocol).

store_kv → kv_store kernel; forward → decode kernel for the first ``num_decodes`` sequences and
the paged prefill kernel for the rest. A decode-only forward is CUDA-graph safe: no host syncs,
launch shapes and buffer sizes come from host ints of the metadata (``num_decodes``,
``max_seq_len``), never from tensor contents. The split count can be fixed through
``meta.decode_splits``: runtime/executor/cuda_graphs.py captures one graph per count and replays the one an
eager step of the same shape would choose.
"""

from __future__ import annotations

import torch

from runtime.executor.attention.metadata import AttentionMetadata
from runtime.executor.kernels.kv_store import store_kv
from runtime.executor.kernels.launch import Launch, no_launch
from runtime.executor.kernels.paged_attention import choose_num_splits, decode_launch, num_sms
from runtime.executor.kernels.prefill import prefill_launch


class TritonAttentionBackend:
    name = "triton"

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cuda")
        self.num_sms = num_sms(self.device)

    def decode_splits(self, num_decodes: int, num_kv_heads: int, max_seq_len: int) -> int:
        return choose_num_splits(num_decodes, num_kv_heads, max_seq_len, self.num_sms)

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        store_kv(k, v, k_cache, v_cache, slot_mapping)

    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty_like(q)
        self.prepare(meta, q, out, k_cache, v_cache)(k_cache, v_cache, scale)
        return out

    def prepare(self, meta: AttentionMetadata, q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> Launch:
        nd = meta.num_decodes
        decode = prefill = no_launch
        if nd:
            splits = meta.decode_splits or self.decode_splits(nd, k_cache.shape[2], meta.max_seq_len)
            decode = decode_launch(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd], out[:nd],
                                   num_splits=splits)
        num_prefills = meta.num_seqs - nd
        if num_prefills:
            tokens = (meta.query_start_loc_cpu[nd], meta.query_start_loc_cpu[meta.num_seqs])
            prefill = prefill_launch(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                     out, nd, num_prefills, meta.max_query_len, tokens, max(meta.seq_lens_cpu[nd:]))
        if prefill is no_launch:
            return decode
        if decode is no_launch:
            return prefill

        def both(k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> None:
            decode(k_cache, v_cache, scale)
            prefill(k_cache, v_cache, scale)

        return both
