"""A copy of a byte-level BPE tokenizer folder whose vocabulary covers ``--vocab`` ids, for serving a
random-weight model shape with a larger vocabulary than the tokenizer at hand (Qwen3-0.6B's
151,936 ids with SmolLM2's 49,152): every id the model samples then decodes to text, so every token
streams a chunk and the client's TTFT and ITL count tokens, not the ids that happen to have text.
Id i past the original vocabulary becomes the token " <i>" (never produced by encoding: no merge
leads to it).

    python scripts/widen_tokenizer.py .gpu/tokenizer .gpu/tokenizer_152k --vocab 151936
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

SPACE = "\u0120"  # byte-level BPE's spelling of b" "


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="a tokenizer folder (tokenizer.json, byte-level BPE)")
    p.add_argument("target", type=Path)
    p.add_argument("--vocab", type=int, required=True, help="ids to cover")
    args = p.parse_args()
    tok = json.loads((args.source / "tokenizer.json").read_text())
    if tok["model"]["type"] != "BPE" or (tok.get("decoder") or {}).get("type") != "ByteLevel":
        raise SystemExit(f"{args.source}: not a byte-level BPE tokenizer")
    vocab = tok["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in tok.get("added_tokens", [])}
    for i in range(args.vocab):
        if i not in taken:
            name = f"{SPACE}<{i}>"
            if name in vocab:
                raise SystemExit(f"{name!r} is already a token")
            vocab[name] = i
    args.target.mkdir(parents=True, exist_ok=True)
    for f in args.source.iterdir():
        if f.name != "tokenizer.json" and f.is_file():
            shutil.copy(f, args.target / f.name)
    (args.target / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    print(f"{args.target}: {len(vocab)} ids")


if __name__ == "__main__":
    main()
