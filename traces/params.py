"""Sampling parameters: part of the log's vocabulary (every ``Arrived`` event carries them).

Validated on construction: a bad value raises ``InvalidRequest`` naming the field, so a CLI flag or
an HTTP field that feeds it gives a clear message (and an HTTP 400) instead of a traceback.
"""

from __future__ import annotations

import math

import msgspec


class InvalidRequest(ValueError):
    """A request or sampling parameter is invalid; the message names the field."""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; N = sampled token + top-N
    n: int = 1

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> InvalidRequest:
            return InvalidRequest(f"{name} {rule}, got {getattr(self, name)!r}")

        for name in _FLOAT_FIELDS:  # JSON has no NaN or infinity: the log could not hold them
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise bad(name, "must be a number")
            if not math.isfinite(value):
                raise bad(name, "must be a finite number")
        if self.max_tokens < 1:
            raise bad("max_tokens", "must be >= 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", "must be between 0 and max_tokens")
        if self.temperature < 0:
            raise bad("temperature", "must be >= 0")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k < 0:
            raise bad("top_k", "must be >= 0 (0 disables it)")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise bad(name, "must be in [-2, 2]")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "must be > 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", "must be in [0, 20]")
        if self.n < 1:
            raise bad("n", "must be >= 1")
        if any(s == "" for s in self.stop):
            raise bad("stop", "must not contain empty strings")
        if not all(_is_utf8(s) for s in self.stop):
            raise bad("stop", "must be valid Unicode text (no lone surrogates)")
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative token ids")


_FLOAT_FIELDS = tuple(f.name for f in msgspec.structs.fields(SamplingParams) if f.type is float)


def _is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (a lone surrogate from a JSON escape can't)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
