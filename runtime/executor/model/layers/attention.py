"""Self-attention over the flattened batch: one fused q/k/v matmul, optional per-head q/k RMSNorm
(Qwen3), rotary, the KV store and attention core of the backend (paged KV), then o_proj."""

from __future__ import annotations

import torch
from torch import nn

from runtime.executor.attention import AttentionBackend, AttentionMetadata
from runtime.executor.model.layers.fused import fused_rms_norm
from runtime.executor.model.layers.linear import Linear
from runtime.executor.model.layers.norm import RMSNorm
from runtime.executor.model.layers.rotary import Rope
from runtime.executor.model.spec import ModelSpec


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.q_size, spec.kv_size
        self.scale = spec.head_dim ** -0.5
        self.qkv_proj = Linear(spec.hidden_size, spec.q_size + 2 * spec.kv_size, bias=spec.qkv_bias)
        self.o_proj = Linear(spec.q_size, spec.hidden_size, bias=False)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None

    def forward(self, x: torch.Tensor, rope: Rope, kv: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata, backend: AttentionBackend, fused: bool = False) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        if fused:
            q, k, v = self._qkv_fused(qkv, rope)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(T, self.num_heads, self.head_dim)
            k = k.view(T, self.num_kv_heads, self.head_dim)
            v = v.view(T, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rope(q), rope(k)
        k_cache, v_cache = kv
        backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = backend.forward(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.reshape(T, self.q_size))

    def _qkv_fused(self, qkv: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as ``[T, heads, head_dim]`` views of the qkv output (row stride q+2kv heads; the
        attention and KV-store kernels take strided views), q and k normed (Qwen3) and rotated in
        place: q and k are adjacent heads, so ``rope`` rotates both in one launch."""
        h, kvh = self.num_heads, self.num_kv_heads
        heads = qkv.view(qkv.shape[0], h + 2 * kvh, self.head_dim)
        q, k, v = heads.split([h, kvh, kvh], dim=1)
        if self.q_norm is not None:
            fused_rms_norm(q, self.q_norm.weight, self.q_norm.eps, out=q)
            fused_rms_norm(k, self.k_norm.weight, self.k_norm.eps, out=k)
        rope(heads[:, : h + kvh])
        return q, k, v
