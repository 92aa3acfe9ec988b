"""Prompt records: what the log stores for a prompt, and how to turn it back into token ids.

A prompt is either its token ids, or a synthetic description (length + prefix-segment ids) for
trace workloads whose text is unknown. Synthetic tokens are a pure function of (workload seed,
segment id) so that equal segment ids give equal tokens and prefix caching behaves as in the
trace, while the log stays small: a million requests are a million short lines.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import msgspec
import numpy as np


class PromptIds(msgspec.Struct, tag="ids", frozen=True):
    token_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class PromptSynthetic(msgspec.Struct, tag="synthetic", frozen=True, kw_only=True):
    """``num_tokens`` tokens; segment i (``segment_len`` tokens) is drawn from ``segment_ids[i]``.

    Tokens past the listed segments are unique to this prompt (drawn from ``unique_seed``).
    """

    num_tokens: int
    seed: int = 0  # workload seed: every synthetic token depends on it
    unique_seed: int = 0
    segment_ids: list[int] = []
    segment_len: int = 512
    vocab_size: int = 32000

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {self.num_tokens}")
        if self.segment_len < 1:
            raise ValueError(f"segment_len must be >= 1, got {self.segment_len}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")


Prompt = PromptIds | PromptSynthetic

# what a log records of a live prompt (EngineCore's trace_prompts): its token ids; its length and
# one hash id per full block (a PromptSynthetic whose equal leading ids mean equal prefixes); or
# its length alone
TRACE_PROMPTS = ("ids", "hashes", "none")


class _SegmentCache:
    """Bounded memo of synthetic segments; the same segment recurs across many requests."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.data: dict[tuple[int, int, int, int], np.ndarray] = {}

    def get(self, seed: int, segment: int, length: int, vocab: int) -> np.ndarray:
        key = (seed, segment, length, vocab)
        tokens = self.data.get(key)
        if tokens is None:
            rng = np.random.default_rng([seed & 0xFFFFFFFF, 0, segment & 0xFFFFFFFFFFFF])
            tokens = rng.integers(0, vocab, size=length, dtype=np.int32)
            if len(self.data) >= self.capacity:
                self.data.pop(next(iter(self.data)))
            self.data[key] = tokens
        return tokens


_segments = _SegmentCache()


def materialize(prompt: Prompt | Sequence[int]) -> array:
    """Token ids of a prompt as an int32 ``array`` (the engine's token storage)."""
    if isinstance(prompt, PromptIds):
        return array("i", prompt.token_ids)
    if not isinstance(prompt, PromptSynthetic):
        return array("i", prompt)
    p = prompt
    parts: list[np.ndarray] = []
    covered = 0
    for seg in p.segment_ids:
        if covered >= p.num_tokens:
            break
        take = min(p.segment_len, p.num_tokens - covered)
        parts.append(_segments.get(p.seed, seg, p.segment_len, p.vocab_size)[:take])
        covered += take
    if covered < p.num_tokens:
        rng = np.random.default_rng([p.seed & 0xFFFFFFFF, 1, p.unique_seed & 0xFFFFFFFFFFFF])
        parts.append(rng.integers(0, p.vocab_size, size=p.num_tokens - covered, dtype=np.int32))
    out = array("i")
    out.frombytes(np.concatenate(parts).astype(np.int32, copy=False).tobytes())
    return out
