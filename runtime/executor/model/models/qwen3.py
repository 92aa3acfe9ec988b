"""Qwen3: Llama with a per-head RMSNorm on q and k before rotary; q/k/v bias as config.json says."""

from __future__ import annotations

from typing import Any

from runtime.executor.model.registry import Architecture, register


def read_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qkv_bias": bool(cfg.get("attention_bias", False)), "qk_norm": True}


ARCHITECTURE = register(Architecture("qwen3", read_config))
