"""How a step that carries prefill is padded, shared by the runtime's piecewise graphs and the cost models.

On CUDA with the Triton backend and graphs on, a step with a prefill chunk replays graphs captured
for a few token counts (runtime/executor/piecewise_graphs.py): its GEMMs run on the next captured
count, so a 1,100-token step costs what a 1,536-token one does outside attention. On the H200 a
padded token costs about 1.2–1.8 µs of a Qwen3-0.6B step in the live runs' mixed steps.

A log's header says whether its steps were padded and up to what (``extra.piecewise_tokens``, the
largest captured count; 0: eager). A log recorded before headers carried it ran on CUDA with the
Triton backend padded up to the step budget (graphs were on unless ``--enforce-eager``, which no
fit log in this repository used).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any


def token_buckets(max_tokens: int) -> list[int]:
    """Padded step sizes: powers of two to 512, then multiples of 512 to 4096, then of 2048."""
    sizes = [16, 32, 64, 128, 256] + list(range(512, 4097, 512)) + list(range(6144, max_tokens + 2048, 2048))
    return sorted({s for s in sizes if s < max_tokens} | {max_tokens})


@dataclass(frozen=True)
class StepPadding:
    """The captured token counts of one engine: ``padding(tokens)`` is what a prefill-carrying step
    of ``tokens`` adds (0 past the largest, where the step runs eagerly)."""

    max_tokens: int
    buckets: tuple[int, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        object.__setattr__(self, "buckets", tuple(token_buckets(self.max_tokens)))

    def padding(self, tokens: int) -> int:
        if tokens > self.max_tokens:
            return 0
        return self.buckets[bisect_left(self.buckets, tokens)] - tokens

    @classmethod
    def from_header(cls, config: dict[str, Any] | None, extra: dict[str, Any] | None) -> StepPadding | None:
        """The padding of a log's prefill steps (None: not padded), from its header's config and extra."""
        extra = extra or {}
        if "piecewise_tokens" in extra:
            tokens = int(extra["piecewise_tokens"] or 0)
            return cls(tokens) if tokens > 0 else None
        if str(extra.get("device") or "").startswith("cuda") and extra.get("attention_backend") == "triton":
            budget = ((config or {}).get("scheduler") or {}).get("max_num_batched_tokens")
            return cls(int(budget)) if budget else None
        return None
