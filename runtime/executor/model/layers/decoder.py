"""The decoder layer and ``CausalLM``, the decoder-only body every registered architecture builds
(its config picks the variant: q/k/v and MLP biases, per-head q/k norm), over one flattened
variable-length batch.

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

import torch
from torch import nn

from runtime.executor.attention import AttentionBackend, AttentionMetadata
from runtime.executor.model.layers.attention import Attention
from runtime.executor.model.layers.fused import fused_rotary
from runtime.executor.model.layers.linear import Linear, cpu_packed, linear, pack_cpu_weights, packed_linear
from runtime.executor.model.layers.mlp import MLP
from runtime.executor.model.layers.norm import RMSNorm
from runtime.executor.model.layers.rotary import RotaryTable, apply_rotary
from runtime.executor.model.spec import ModelSpec


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
        # (a weight given: no default init, whose normal_ on the meta device imports torch._dynamo at each start)
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size,
                                         _weight=torch.empty(spec.vocab_size, spec.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = None if spec.tie_word_embeddings else Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.rotary = rotary

    head_packed: torch.Tensor | None = None  # a tied head's embedding, packed (pack_cpu_weights)

    def pack_cpu_weights(self) -> None:
        """Pack the linears for the CPU's oneDNN GEMM (runtime/executor/model/layers/linear.py), a tied
        LM head's copy of the embedding too. Call once the weights are final."""
        pack_cpu_weights(self)
        self.head_packed = cpu_packed(self.embed_tokens.weight) if self.lm_head is None else None

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the normed hidden states ``x``."""
        if self.lm_head is not None:
            return self.lm_head(x).float()
        if self.head_packed is not None:
            return packed_linear(x, self.head_packed).float()
        return linear(x, self.embed_tokens.weight).float()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend, logits_indices: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[len(logits_indices), vocab]`` in fp32 (all tokens when indices are None)."""
        x = self.embed_tokens(input_ids)
        if self.use_fused_kernels:
            x = self._fused_layers_and_norm(x, positions, kv_caches, meta, backend)
            if logits_indices is not None:  # rows are independent: normed all, now pick
                x = x[logits_indices]
            return self.logits(x)
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
        return self.logits(self.norm(x))

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
