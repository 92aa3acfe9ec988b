"""Fill a ``CausalLM`` from HF-named tensors: fuse q/k/v and gate/up, cast, place on the device.

Tensors arrive one at a time (safetensors shards are read lazily), so peak host memory stays
near one shard rather than the whole checkpoint twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from runtime.executor.model.layers.decoder import CausalLM
from runtime.executor.model.spec import ModelLoadError

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
# HF name inside a layer -> (our parameter, slot in the fused tensor or None)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weight files")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_tensor(name)


def load_weights(model: CausalLM, tensors: Iterable[tuple[str, torch.Tensor]], where: str) -> None:
    """Copy checkpoint tensors into ``model`` (already materialised on its device and dtype)."""
    params = dict(model.named_parameters())
    spec = model.spec
    split = {"self_attn.qkv_proj": [spec.q_size, spec.kv_size, spec.kv_size],
             "mlp.gate_up_proj": [spec.intermediate_size, spec.intermediate_size]}
    loaded: set[str] = set()
    for hf_name, tensor in tensors:
        name = _our_name(hf_name)
        if name is None:
            continue  # e.g. rotary inv_freq buffers in old checkpoints
        target_name, slot = name
        if target_name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: the checkpoint repeats the embedding
        target = params.get(target_name)
        if target is None:
            raise ModelLoadError(f"{where}: unexpected tensor {hf_name!r} for a {spec.model_type} model")
        if slot is not None:
            base = target_name.rsplit(".", 1)[0].split(".", 2)[-1]
            sizes = split[base]
            offset = sum(sizes[:slot])
            target = target.narrow(0, offset, sizes[slot])
            loaded.add(f"{target_name}#{slot}")
        else:
            loaded.add(target_name)
        if tuple(tensor.shape) != tuple(target.shape):
            raise ModelLoadError(f"{where}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor.to(target.dtype))
    missing = [n for n in _expected(model, split) if n not in loaded]
    if missing:
        raise ModelLoadError(f"{where}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")


def _our_name(hf_name: str) -> tuple[str, int | None] | None:
    if hf_name == "model.embed_tokens.weight":
        return "embed_tokens.weight", None
    if hf_name == "model.norm.weight":
        return "norm.weight", None
    if hf_name == "lm_head.weight":
        return "lm_head.weight", None
    m = _LAYER.fullmatch(hf_name)
    if m is None:
        return None
    layer, rest = m.groups()
    module, kind = rest.rsplit(".", 1)
    if kind not in ("weight", "bias"):
        return None
    if module in _FUSED:
        fused, slot = _FUSED[module]
        return f"layers.{layer}.{fused}.{kind}", slot
    return f"layers.{layer}.{module}.{kind}", None


def _expected(model: CausalLM, split: dict[str, list[int]]) -> list[str]:
    names = []
    for name, _ in model.named_parameters():
        base = name.rsplit(".", 1)[0].split(".", 2)[-1]
        if base in split:
            names += [f"{name}#{i}" for i in range(len(split[base]))]
        else:
            names.append(name)
    return names


def init_random(model: CausalLM, seed: int, std: float = 0.02) -> None:
    """Random weights with real shapes (benchmarks): normal(0, std), norms at one."""
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)
