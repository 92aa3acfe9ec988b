"""GGUF → HF folder, once: transformers dequantizes the file (slow: ~25 s for SmolLM2), so the
result (config.json + fp32 safetensors + tokenizer files) is cached on disk under the file's
identity and every later load is a plain folder load (~1 s).

Cache root: ``$MINIVLLM_CACHE`` or ``~/.cache/minivllm``; a half-written conversion never becomes
visible (written to a temporary folder, then renamed).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from runtime.executor.cache_dir import cache_root
from runtime.executor.model.spec import ModelLoadError


def converted_folder(gguf_path: Path, identity_hash: str) -> Path:
    """The HF folder for ``gguf_path``, converting it on first use."""
    target = cache_root() / "gguf" / f"{gguf_path.stem}-{identity_hash}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        _convert(gguf_path, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf_path: Path, out: Path) -> None:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a model dependency
        raise ModelLoadError(f"{gguf_path}: loading GGUF needs transformers and gguf ({e})") from e
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    except (ValueError, NotImplementedError, KeyError, OSError) as e:
        raise ModelLoadError(f"{gguf_path}: transformers could not read this GGUF file: {e}") from e
    # save_pretrained refuses GGUF-loaded models; the dequantized tensors are plain fp32, so write
    # them ourselves (a tied lm_head is the embedding: stored once)
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (k == "lm_head.weight" and config.get("tie_word_embeddings"))}
    save_file(state, str(out / "model.safetensors"))
    tokenizer.save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)
