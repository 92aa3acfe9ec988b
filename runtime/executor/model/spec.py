"""ModelSpec: the architecture facts the forward needs (parsed from a config.json by
``hf_config``); ``ModelLoadError``; real model shapes for benchmarks.

One spec covers the decoder-only family this engine runs; the variant flags (q/k/v and MLP
biases, per-head q/k RMSNorm) are set by each architecture's config reader (``models/``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ModelLoadError(ValueError):
    """A model can't be found or loaded; the message names the path (and the field, if any)."""


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # rope_type, rope_theta and the scaling keys of that type (HF ``rope_parameters`` form)
    rope: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None  # what the checkpoint says, used when dtype is "auto"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes for one token across all layers (K and V)."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes


# Real model shapes for benchmarks with random weights (HF config.json form, so the HF peer can
# build the very same architecture).
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "intermediate_size": 1536, "vocab_size": 49152, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192, "rope_theta": 100000.0, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2,
    },
    "qwen3-0.6b": {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 3072, "vocab_size": 151936, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960, "rope_theta": 1000000.0, "tie_word_embeddings": True,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
}
