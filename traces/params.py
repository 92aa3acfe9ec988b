"""Sampling parameters: part of the log's vocabulary (every ``Arrived`` event carries them).

Validated on construction: a bad value raises ``InvalidRequest`` naming the field, so a CLI flag or
an HTTP field that feeds it gives a clear message (and an HTTP 400) instead of a traceback.
"""

from __future__ import annotations

import math

import msgspec


class InvalidRequest(ValueError):
    """A request or sampling parameter is invalid; the message names the field."""


# What the sampler can carry out: it works in float32 and int32 on the device, so a value past
# these bounds would round to 0 or overflow there and turn a row's weights into NaN (a repetition
# penalty of 1e-300 is 0 in float32: logit / 0). The HTTP layer uses the same bounds.
TEMPERATURE_MAX = 100.0  # past it every token is nearly equally likely anyway
REPETITION_PENALTY_MIN, REPETITION_PENALTY_MAX = 0.01, 100.0  # logit / r and logit * r stay finite
PENALTY_MAX = 2.0  # presence and frequency, either sign (OpenAI's range)
INT32_MAX = 2**31 - 1  # top_k and token ids are int32 on the device
LOGPROBS_MAX = 20
# the detokenizer looks for every proper prefix of every stop string after each token
STOP_STRINGS_MAX, STOP_STRING_CHARS_MAX = 32, 256


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
        if not 0 <= self.temperature <= TEMPERATURE_MAX:
            raise bad("temperature", f"must be in [0, {TEMPERATURE_MAX:g}]")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if not 0 <= self.top_k <= INT32_MAX:
            raise bad("top_k", f"must be in [0, {INT32_MAX}] (0 disables it)")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -PENALTY_MAX <= getattr(self, name) <= PENALTY_MAX:
                raise bad(name, f"must be in [-{PENALTY_MAX:g}, {PENALTY_MAX:g}]")
        if not REPETITION_PENALTY_MIN <= self.repetition_penalty <= REPETITION_PENALTY_MAX:
            raise bad("repetition_penalty", f"must be in [{REPETITION_PENALTY_MIN:g}, {REPETITION_PENALTY_MAX:g}]")
        if self.logprobs is not None and not 0 <= self.logprobs <= LOGPROBS_MAX:
            raise bad("logprobs", f"must be in [0, {LOGPROBS_MAX}]")
        if self.n < 1:
            raise bad("n", "must be >= 1")
        if any(s == "" for s in self.stop):
            raise bad("stop", "must not contain empty strings")
        if len(self.stop) > STOP_STRINGS_MAX:
            raise InvalidRequest(f"stop must hold at most {STOP_STRINGS_MAX} strings, got {len(self.stop)}")
        if any(len(s) > STOP_STRING_CHARS_MAX for s in self.stop):
            raise InvalidRequest(f"stop strings must be at most {STOP_STRING_CHARS_MAX} characters long")
        if not all(_is_utf8(s) for s in self.stop):
            raise bad("stop", "must be valid Unicode text (no lone surrogates)")
        if any(not 0 <= t <= INT32_MAX for t in self.stop_token_ids):
            raise bad("stop_token_ids", f"must be token ids in [0, {INT32_MAX}]")


_FLOAT_FIELDS = tuple(f.name for f in msgspec.structs.fields(SamplingParams) if f.type is float)


def _is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (a lone surrogate from a JSON escape can't)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
