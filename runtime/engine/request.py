"""The request state machine (sampling parameters live in ``traces.params``).

    WAITING ──admit──▶ RUNNING ──commit──▶ FINISHED
       ▲                  │
       └──── PREEMPTED ◀──┘   (recompute: KV dropped, tokens kept)
    any unfinished status ──abort──▶ ABORTED
"""

from __future__ import annotations

import enum
from array import array
from typing import Protocol

from traces.params import SamplingParams


class TextStop(Protocol):
    """What a request's text says of its tokens: its stop strings, matched by the serving side's
    detokenizer (the engine owns no text). The commit gives it each step's new tokens of the
    request, so a stop string ends the request in the step that completed it, as a stop token does."""

    def add(self, token_ids: list[int]) -> int | None:
        """Take the step's new tokens; how many of them the text keeps when a stop string completed
        among them (the request ends there), else None."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # transient: back in the waiting queue, KV dropped
    FINISHED = "finished"
    ABORTED = "aborted"

    @property
    def done(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.ABORTED)


class Request:
    """One sequence in the engine. Tokens are prompt + committed outputs in one int32 array."""

    __slots__ = (
        "request_id", "token_ids", "num_prompt_tokens", "params", "arrival_time", "priority",
        "status", "num_computed_tokens", "num_cached_tokens", "finish_reason", "admit_seq",
        "max_total_tokens", "num_preemptions", "eos_token_id", "cache_salt", "stops_on_token", "token_may_matter",
        "text_stop",
    )

    def __init__(
        self,
        request_id: int,
        prompt_token_ids: array,
        params: SamplingParams,
        arrival_time: float,
        max_model_len: int,
        priority: int = 0,
        eos_token_id: int | None = None,
        cache_salt: str | None = None,
        text_stop: TextStop | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.arrival_time = arrival_time
        self.priority = priority
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.finish_reason: str | None = None
        self.admit_seq = -1
        self.max_total_tokens = min(self.num_prompt_tokens + params.max_tokens, max_model_len)
        self.num_preemptions = 0
        self.eos_token_id = eos_token_id
        self.cache_salt = cache_salt  # roots its prefix-hash chain: shares blocks only within the salt
        # whether a sampled token's value can end it (eos, a stop token id); if not, only its length
        # does (``check_stop``'s answer is then known without it). Params and eos are fixed at creation.
        self.stops_on_token = bool(params.stop_token_ids) or (not params.ignore_eos and eos_token_id is not None)
        # False: ``next_token_matters`` is False all along (no stop strings, penalties or token stops)
        self.token_may_matter = self.stops_on_token or bool(params.stop) or params.repetition_penalty != 1.0 \
            or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        self.text_stop = text_stop  # its stop strings' matcher (None: none, or no text: a simulation)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:].tolist()

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens].tolist()

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens still to compute before the next sample (1 for a decoding request)."""
        return len(self.token_ids) - self.num_computed_tokens

    def next_token_matters(self) -> bool:
        """Whether the value of this request's next sampled token can change what the host does
        next: end it (eos, stop token ids, stop strings; not before min_tokens) or feed the sampler
        (penalties read the history). Length limits don't count: they are known in advance."""
        p = self.params
        if p.stop or p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            return True
        if len(self.token_ids) + 1 - self.num_prompt_tokens < p.min_tokens:
            return False
        return bool(p.stop_token_ids) or (not p.ignore_eos and self.eos_token_id is not None)

    def check_stop(self, token: int) -> str | None:
        """Token-level stop after appending ``token``; stop strings live in the detokenizer."""
        p = self.params
        n_tokens = len(self.token_ids)
        n_out = n_tokens - self.num_prompt_tokens
        if n_out >= p.min_tokens:
            if not p.ignore_eos and token == self.eos_token_id:
                return "stop"
            if token in p.stop_token_ids:
                return "stop"
        if n_tokens >= self.max_total_tokens:
            return "length"
        return None

    def __repr__(self) -> str:
        return (f"Request(id={self.request_id}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens})")
