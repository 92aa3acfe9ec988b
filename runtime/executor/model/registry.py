"""Architectures by HF ``model_type``: how each reads its own config.json fields, and which model
class it builds. ``models/`` fills the registry; ``hf_config.spec_from_hf_config`` and the loader
consult it, so no other module branches on ``model_type``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.executor.model.layers.decoder import CausalLM
from runtime.executor.model.spec import ModelLoadError


@dataclass(frozen=True)
class Architecture:
    model_type: str
    # config.json -> the ModelSpec fields this architecture sets itself (qkv_bias, mlp_bias,
    # qk_norm); the shared Llama fields (sizes, eps, rope, ...) are read by spec_from_hf_config
    read_config: Callable[[dict[str, Any]], dict[str, Any]]
    # built as model_class(spec, rotary, use_fused_kernels=...)
    model_class: type[CausalLM] = CausalLM


ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    if arch.model_type in ARCHITECTURES:  # two files claiming one model_type: a copy-paste slip
        raise ValueError(f"model_type {arch.model_type!r} is already registered")
    ARCHITECTURES[arch.model_type] = arch
    return arch


def get_architecture(model_type: str | None, where: str = "config.json", name: str | None = None) -> Architecture:
    """The architecture registered for ``model_type``; ``where`` (the file) and ``name`` (its HF
    class, from ``architectures``) only word the error."""
    arch = ARCHITECTURES.get(model_type or "")
    if arch is None:
        raise ModelLoadError(f"{where}: architecture {name or model_type!r} (model_type {model_type!r}) is not "
                             f"supported; supported model types: {', '.join(sorted(ARCHITECTURES))}")
    return arch
