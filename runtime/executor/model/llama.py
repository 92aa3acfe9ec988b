"""Llama-family decoder (Llama, Qwen2, Qwen3) over one flattened variable-length batch.

The batch is T tokens of many sequences side by side: ``input_ids [T]``, ``positions [T]``; which
token belongs to which sequence, and where its KV lives, is in the attention metadata. q/k/v and
gate/up are fused into one matmul each (fewer, larger GEMMs); everything else follows HF's
arithmetic order (fp32 RMSNorm, HF rotary) so greedy tokens match HF token for token.
Logits are computed only for ``logits_indices`` (the last token of each sampling span).

``use_fused_kernels`` (chosen by the loader: CUDA and fp16/bf16) switches to the fused forward
(vLLM's layout): the residual stream travels beside the hidden state and each residual add runs
inside the next RMSNorm's kernel (the last one inside the final norm's), q and k are normed
(Qwen3) and rotated in place in the qkv output (one rotary launch for both), and SiLU-and-mul is
one kernel. Same rounding points as the unfused path, so the same bits, in ~4 fewer kernels per
layer (runtime/executor/kernels/fused_norm_rope.py, silu_and_mul.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from runtime.executor.attention import AttentionBackend, AttentionMetadata
from runtime.executor.model.rope import RotaryTable, apply_rotary
from runtime.executor.model.spec import ModelSpec

Rope = Callable[[torch.Tensor], torch.Tensor]


# Triton kernels, imported on first use (CPU-only installs have no Triton)
def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    from runtime.executor.kernels.fused_norm_rope import rms_norm

    return rms_norm(x, weight, eps, out)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    from runtime.executor.kernels.fused_norm_rope import add_rms_norm

    return add_rms_norm(x, residual, weight, eps)


def fused_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    from runtime.executor.kernels.fused_norm_rope import rotary

    return rotary(x, cos, sin, positions, out)


def fused_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    from runtime.executor.kernels.silu_and_mul import silu_and_mul

    return silu_and_mul(gate_up)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, except that on the CPU 8..15 rows are padded to 16: the CPU GEMM takes a slow path
    for those row counts (measured on this machine: 9-15 rows cost 1.2-1.8x as much as 16), which a
    decode step with that many sequences would pay in every layer. Rows are independent, so the
    real rows get the same result."""
    rows = x.shape[0]
    if 8 <= rows < 16 and x.device.type == "cpu":
        return F.linear(F.pad(x, (0, 0, 0, 16 - rows)), weight, bias)[:rows]
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype != torch.float32:
            return fused_rms_norm(x, self.weight, self.eps)  # one fused kernel instead of ~8
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused path: ``(norm(x + residual), x + residual)`` in one kernel; residual None (the
        first layer): x is the residual stream, ``(norm(x), x)``."""
        if residual is None:
            return fused_rms_norm(x, self.weight, self.eps), x
        return fused_add_rms_norm(x, residual, self.weight, self.eps)


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


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.intermediate = spec.intermediate_size
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=spec.mlp_bias)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        if fused:
            return self.down_proj(fused_silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x, rope, kv, meta, backend):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv, meta, backend)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, x, residual, rope, kv, meta, backend):
        """The same layer with the residual adds moved into the norms: takes the previous layer's
        MLP output and the residual stream before it (None for layer 0: x is the embedding), returns
        this layer's pair; the caller adds the last pair inside the final norm."""
        x, residual = self.input_layernorm.add_forward(x, residual)
        x = self.self_attn(x, rope, kv, meta, backend, fused=True)
        x, residual = self.post_attention_layernorm.add_forward(x, residual)
        return self.mlp(x, fused=True), residual


class CausalLM(nn.Module):
    """The whole model. ``kv_caches[i]`` is layer i's ``(k_cache, v_cache)`` pair."""

    def __init__(self, spec: ModelSpec, rotary: RotaryTable, use_fused_kernels: bool = False) -> None:
        super().__init__()
        self.spec = spec
        self.use_fused_kernels = use_fused_kernels  # Triton fused forward (CUDA, fp16/bf16: see the docstring)
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = None if spec.tie_word_embeddings else Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.rotary = rotary

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend, logits_indices: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[len(logits_indices), vocab]`` in fp32 (all tokens when indices are None)."""
        x = self.embed_tokens(input_ids)
        if self.use_fused_kernels:
            x = self._fused_layers_and_norm(x, positions, kv_caches, meta, backend)
            if logits_indices is not None:  # rows are independent: normed all, now pick
                x = x[logits_indices]
            return linear(x, self.lm_head_weight).float()
        table = self.rotary
        if x.is_cuda and x.dtype != torch.float32:  # one fused kernel per tensor
            def rope(t: torch.Tensor) -> torch.Tensor:
                return fused_rotary(t, table.cos, table.sin, positions)
        else:  # HF's exact op order (fp32 token-for-token equality)
            cos, sin = table.lookup(positions)

            def rope(t: torch.Tensor) -> torch.Tensor:
                return apply_rotary(t, cos, sin)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, rope, kv, meta, backend)
        if logits_indices is not None:
            x = x[logits_indices]
        return linear(self.norm(x), self.lm_head_weight).float()

    def _fused_layers_and_norm(self, x: torch.Tensor, positions: torch.Tensor,
                               kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                               backend: AttentionBackend) -> torch.Tensor:
        """The layers and the final norm on the fused path: the last residual add runs in that norm."""
        table = self.rotary

        def rope(t: torch.Tensor) -> torch.Tensor:  # in place: t is a view of the qkv output
            return fused_rotary(t, table.cos, table.sin, positions, out=t)

        residual = None
        for layer, kv in zip(self.layers, kv_caches):
            x, residual = layer.forward_fused(x, residual, rope, kv, meta, backend)
        return self.norm.add_forward(x, residual)[0]
