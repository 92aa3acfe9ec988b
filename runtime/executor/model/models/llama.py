"""Llama (SmolLM2 is one): q/k/v and MLP biases as config.json says. HF also puts
``attention_bias`` on o_proj, which the shared body lacks: such a checkpoint is refused at load
(unexpected tensor), never run wrong."""

from __future__ import annotations

from typing import Any

from runtime.executor.model.registry import Architecture, register


def read_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qkv_bias": bool(cfg.get("attention_bias", False)), "mlp_bias": bool(cfg.get("mlp_bias", False))}


ARCHITECTURE = register(Architecture("llama", read_config))
