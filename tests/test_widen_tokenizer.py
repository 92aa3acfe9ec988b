"""scripts/widen_tokenizer.py: every id of a larger vocabulary decodes to text, the original ids as
before, and encoding never yields an added id."""

from __future__ import annotations

import sys

from transformers import AutoTokenizer

from tests.smollm2_tokenizer import load


def test_widened_tokenizer_covers_every_id(tmp_path, monkeypatch):
    from scripts.widen_tokenizer import main

    original = load()
    source = tmp_path / "source"
    original.save_pretrained(source)
    vocab = len(original) + 100
    monkeypatch.setattr(sys, "argv", ["widen", str(source), str(tmp_path / "wide"), "--vocab", str(vocab)])
    main()
    wide = AutoTokenizer.from_pretrained(tmp_path / "wide")
    assert len(wide) == vocab
    ids = [28, 42, 1000, len(original), vocab - 1]
    assert wide.decode(ids) == original.decode(ids[:3]) + f" <{len(original)}> <{vocab - 1}>"
    text = f"The <{len(original)}> tokens, and {vocab - 1} more."
    assert wide(text)["input_ids"] == original(text)["input_ids"]
