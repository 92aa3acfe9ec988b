"""Rotary position embedding: inverse frequencies per rope type, and a cos/sin table by position.

The formulas follow transformers' ``modeling_rope_utils`` (default, linear, llama3, yarn) so the
cos/sin values are bit-identical to HF's; the table is computed once for ``max_positions`` and
indexed by each token's position, which is what lets one flattened batch mix sequences.
Dynamic NTK is not offered: its frequencies depend on each sequence's current length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

# What the attention layer gets: rotates a [T, heads, head_dim] tensor by the step's positions
# (the table lookup, or the fused kernel, is bound once per forward by the model).
Rope = Callable[[torch.Tensor], torch.Tensor]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # what inv_freq_and_scale computes


def inv_freq_and_scale(rope: dict[str, Any], head_dim: int, max_position_embeddings: int
                       ) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] fp32, attention scaling applied to cos/sin)."""
    base = float(rope["rope_theta"])
    dim = head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / rope["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if kind == "yarn":
        return _yarn(rope, dim, base, max_position_embeddings)
    raise ValueError(f"rope type {kind!r} is not supported")


def _llama3(inv_freq: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    factor = rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(rope: dict[str, Any], dim: int, base: float, max_pos: int) -> tuple[torch.Tensor, float]:
    original = rope["original_max_position_embeddings"]
    factor = rope.get("factor") or max_pos / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attention_factor = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, attention_factor


class RotaryTable:
    """cos/sin ``[max_positions, head_dim]`` in the model dtype, looked up by token position."""

    def __init__(self, rope: dict[str, Any], head_dim: int, max_position_embeddings: int,
                 max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        inv_freq, scale = inv_freq_and_scale(rope, head_dim, max_position_embeddings)
        positions = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * scale).to(device=device, dtype=dtype)
        self.sin = (emb.sin() * scale).to(device=device, dtype=dtype)
        self.max_positions = max_positions

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, 1, head_dim]`` ready to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's ``x * cos + rotate_half(x) * sin`` on ``[T, heads, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
