"""The text and bytes of each token of a choice, for its logprobs, decoded as the stream is.

A token is not always whole characters: a byte-level BPE splits "中" (3 UTF-8 bytes) over two
tokens, and decoding each alone gives "\\ufffd" for both. Here each token's own bytes come from the
vocabulary (byte-level pieces map back to bytes one character each; SentencePiece's ``<0xNN>``
tokens are one byte), and a choice's tokens run through one incremental UTF-8 decoder, like the
detokenizer that makes the response text:

* ``text``: what the token adds to the response text. A token that ends inside a character adds
  nothing; it is shown as ``bytes:\\xe4\\xb8`` (OpenAI's form for such tokens) and the token that
  completes the character carries it. Special tokens show as themselves but add nothing (the
  response text skips them).
* ``bytes``: the token's own bytes, so that a client joining a choice's ``bytes`` gets its text.
* ``offset``: characters of the response text before the token (completions' ``text_offset``).

A stream keeps one ``ChoiceTokens`` per choice across its chunks, so offsets run on. Tokenizers
other than byte-level BPE decode each token alone (their text may then differ from the response
text around word boundaries).
"""

from __future__ import annotations

import codecs
import functools
import re
from typing import Any

from runtime.serving.detokenizer import is_concatenative

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable character map, character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def bytes_repr(data: bytes) -> str:
    return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


class TokenBytes:
    """A tokenizer's per-token bytes and special ids (cached: a vocabulary's worth at most)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_level = is_concatenative(tokenizer)
        self._alphabet = _byte_level_alphabet() if self.byte_level else {}
        self.special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        self.of = functools.lru_cache(maxsize=1 << 17)(self._bytes)

    def _bytes(self, token: int) -> bytes:
        tok = self.tokenizer
        if token in self.special:
            return tok.decode([token]).encode()
        piece = tok.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            if self.byte_level and all(c in self._alphabet for c in piece):
                return bytes(self._alphabet[c] for c in piece)
            m = _BYTE_TOKEN.fullmatch(piece)
            if m is not None:
                return bytes([int(m.group(1), 16)])
        return tok.decode([token]).encode()


class ChoiceTokens:
    """One choice's tokens, in order: ``add`` each sampled token, ``peek`` at its alternatives."""

    def __init__(self, token_bytes: TokenBytes) -> None:
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.offset = 0  # characters of response text so far

    def add(self, token: int) -> tuple[str, bytes, int]:
        """(text, bytes, offset) of the next token; its text joins the choice's."""
        data = self._bytes.of(token)
        offset = self.offset
        if token in self._bytes.special:
            return data.decode(errors="replace"), data, offset
        text = self._decoder.decode(data)
        self.offset += len(text)
        return text or bytes_repr(data), data, offset

    def peek(self, token: int) -> tuple[str, bytes]:
        """(text, bytes) ``token`` would have had in the sampled token's place."""
        data = self._bytes.of(token)
        if token in self._bytes.special:
            return data.decode(errors="replace"), data
        state = self._decoder.getstate()
        text = self._decoder.decode(data)
        self._decoder.setstate(state)
        return text or bytes_repr(data), data
