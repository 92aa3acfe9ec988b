"""config.json -> ``ModelSpec``: the fields every Llama-like architecture shares are read here, the
rest by the architecture registered for the config's ``model_type`` (``registry``, ``models/``).
Anything unsupported is refused with a ``ModelLoadError`` naming the file, so a user learns at
load time, not from a shape error mid-forward.

This lives apart from ``spec`` because it imports ``models`` (to fill the registry), and the
models import ``spec``.
"""

from __future__ import annotations

from typing import Any

import runtime.executor.model.models  # noqa: F401  (registers the architectures)
from runtime.executor.model.layers.rotary import SUPPORTED_ROPE_TYPES
from runtime.executor.model.registry import get_architecture
from runtime.executor.model.spec import ModelLoadError, ModelSpec


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
    arch = get_architecture(model_type, where, (cfg.get("architectures") or [None])[0])
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
            rope=_rope_parameters(cfg, where),
            eos_token_ids=eos,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            **arch.read_config(cfg),
        )
    except KeyError as e:
        raise ModelLoadError(f"{where}: missing field {e.args[0]!r}") from None
