"""A random-weight HF checkpoint folder of a real model shape, for peers that load a folder
(``transformers serve``): ``config.json`` + safetensors + ``generation_config.json`` + a tokenizer's
files, with the very shapes ``--model random:SHAPE`` serves (``MODEL_SHAPES``: the vocabulary too, so
both servers run identical matrices whatever tokenizer rides along).

    python -m runtime.bench.hf_checkpoint OUT --shape qwen3-0.6b --tokenizer .gpu/tokenizer \
        --dtype bfloat16 --device cuda
    python -m runtime.bench.hf_checkpoint OUT --set num_hidden_layers=2 hidden_size=64 ...   # tiny, for tests

The generation config has ``eos_token_id = -1`` by default (``--keep-eos`` keeps the shape's): random
weights make eos a coin toss, and a server that takes no ``ignore_eos`` field (``transformers serve``
rejects unknown fields) then still generates each request's ``max_tokens``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from runtime.executor.model.spec import MODEL_SHAPES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model")


def checkpoint_config(shape: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The HF config.json of ``shape`` with ``overrides``; a smaller hidden size rescales head_dim so
    heads x head_dim stays hidden (as in the real configs), unless head_dim is overridden too."""
    if shape not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(MODEL_SHAPES)}")
    cfg = dict(MODEL_SHAPES[shape])
    overrides = dict(overrides or {})
    unknown = sorted(k for k in overrides if k not in cfg and k not in ("initializer_range",))
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(unknown)}; known: {', '.join(sorted(cfg))}")
    cfg.update(overrides)
    if "head_dim" not in overrides and ("hidden_size" in overrides or "num_attention_heads" in overrides):
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg


def write_checkpoint(out: str | Path, shape: str = "qwen3-0.6b", *, tokenizer: str | Path | None = None,
                     dtype: str = "bfloat16", device: str = "cpu", seed: int = 0, keep_eos: bool = False,
                     overrides: dict[str, Any] | None = None) -> Path:
    """Write the folder (created or overwritten) and return it."""
    import torch
    import transformers

    cfg = checkpoint_config(shape, overrides)
    cfg_class = transformers.CONFIG_MAPPING[cfg["model_type"]]
    config = cfg_class(**{k: v for k, v in cfg.items() if k != "model_type"})
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.eval()
    if not keep_eos:  # eos off: every request runs to its max_tokens
        model.generation_config.eos_token_id = -1
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tokenizer is not None:
        src = Path(tokenizer)
        copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
        if "tokenizer.json" not in copied and "tokenizer.model" not in copied:
            raise FileNotFoundError(f"{src}: no tokenizer.json or tokenizer.model")
        for name in copied:
            shutil.copy(src / name, out / name)
        _check_vocab(out, cfg["vocab_size"])
    return out


def _check_vocab(folder: Path, vocab_size: int) -> None:
    """Every id the tokenizer makes must index the embedding."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return
    doc = json.loads(path.read_text())
    ids = list(doc.get("model", {}).get("vocab", {}).values()) + [t["id"] for t in doc.get("added_tokens", [])]
    top = max((i for i in ids if isinstance(i, int)), default=-1)
    if top >= vocab_size:
        raise ValueError(f"the tokenizer has id {top}, beyond the model's vocab_size {vocab_size}")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.bench.hf_checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the folder to write")
    p.add_argument("--shape", default="qwen3-0.6b", choices=sorted(MODEL_SHAPES))
    p.add_argument("--tokenizer", help="a folder whose tokenizer files are copied in (default: none)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cpu", help="where the weights are initialised (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-eos", action="store_true", help="keep the shape's eos (default: eos_token_id -1)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. num_hidden_layers=2 hidden_size=64")
    args = p.parse_args(argv)
    overrides = {}
    for term in args.set:
        key, sep, value = term.partition("=")
        if not sep:
            p.error(f"--set {term!r}: expected KEY=VALUE")
        overrides[key] = _value(value)
    try:
        out = write_checkpoint(args.out, args.shape, tokenizer=args.tokenizer, dtype=args.dtype, device=args.device,
                               seed=args.seed, keep_eos=args.keep_eos, overrides=overrides)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {out} ({size / 2**20:,.0f} MiB of weights)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
