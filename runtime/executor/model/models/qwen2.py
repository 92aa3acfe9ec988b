"""Qwen2: Llama with a bias on q, k and v always (HF's Qwen2 reads neither
``attention_bias`` nor ``mlp_bias``)."""

from __future__ import annotations

from typing import Any

from runtime.executor.model.registry import Architecture, register


def read_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qkv_bias": True}


ARCHITECTURE = register(Architecture("qwen2", read_config))
