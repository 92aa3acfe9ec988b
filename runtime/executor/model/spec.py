"""ModelSpec: the architecture facts the forward needs, parsed from an HF ``config.json`` dict.

One spec covers the Llama family this engine runs: Llama (optionally biased), Qwen2 (q/k/v bias)
and Qwen3 (per-head q/k RMSNorm). Anything else is refused with a ``ModelLoadError`` naming the
file, so a user learns at load time, not from a shape error mid-forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ModelLoadError(ValueError):
    """A model can't be found or loaded; the message names the path (and the field, if any)."""


SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


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
    bos_token_id: int | None = None
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


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _rope_parameters(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """Normalise the two spellings: transformers 5 ``rope_parameters`` and the older
    ``rope_theta`` + ``rope_scaling`` keys found in most published config.json files."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    rope_type = params.pop("type", None) or params.get("rope_type") or "default"
    params["rope_type"] = rope_type
    params.setdefault("rope_theta", float(cfg.get("rope_theta", 10000.0)))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(f"{where}: rope type {rope_type!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(f"{where}: partial_rotary_factor != 1 is not supported")
    return params


def spec_from_hf_config(cfg: dict[str, Any], where: str = "config.json",
                        generation_config: dict[str, Any] | None = None) -> ModelSpec:
    """Build a spec from a config.json dict; ``where`` names the file in error messages."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = cfg.get("architectures") or [model_type]
        raise ModelLoadError(f"{where}: architecture {archs[0]!r} (model_type {model_type!r}) is not "
                             f"supported; supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{where}: hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
    if cfg.get("use_sliding_window"):
        raise ModelLoadError(f"{where}: sliding-window attention is not supported")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        eos = _ids((generation_config or {}).get("eos_token_id")) or _ids(cfg.get("eos_token_id"))
        return ModelSpec(
            model_type=model_type,
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            rope=_rope_parameters(cfg, where),
            eos_token_ids=eos,
            bos_token_id=cfg.get("bos_token_id"),
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        )
    except KeyError as e:
        raise ModelLoadError(f"{where}: missing field {e.args[0]!r}") from None


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
