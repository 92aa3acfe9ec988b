"""Drafters: who proposes the tokens a speculating request verifies in its next step.

Speculative decoding inside the batch: a decoding request's span is its last token plus up to K
drafted tokens; the executor computes the target's distribution at every one of those positions
and commits the accepted drafts and one token more (runtime/executor/speculative.py). The
scheduler budgets 1 + K tokens per speculating request inside the step's token budget; the core
rolls the KV of rejected drafts back (runtime/engine/core.py). A drafter only proposes.

Spelled ``METHOD:K`` or ``METHOD:ARG:K`` (``--speculative``; ``parse_speculative`` is the one
home of the rule):

- ``ngram:K``: prompt lookup. The longest of the request's last 8, 6, 4, 3 or 2 tokens that
  occurred before in its prompt + output is found (latest occurrence), and the K tokens that
  followed it are proposed: a longer suffix picks, of the places a short phrase recurs, the one
  that continues as the text does now (in a loop of "it was the age of X, ..." the last loop, not
  the latest "the age of"). Deterministic, pure Python, nothing to load. A request whose drafts
  keep being rejected (text that does not repeat itself) goes quiet, so it costs the batch
  little: each verified draft is compute, and a rejected one buys nothing. A quiet request's
  proposals are still made and scored against the tokens it then commits, but kept back (shadow
  proposals: free, no verification); as soon as one has guessed its first SHADOW_PROBE tokens it
  drafts again, so text that starts repeating itself (a model falling into a loop, a quote) gets
  drafts within a few tokens.
- ``model:PATH:K``: a small draft model (any model the loader reads that shares the target's
  tokenizer), its greedy continuation: built by the executor (runtime/executor/draft_model.py),
  since it runs on the device.

A deterministic drafter is the one-hot case of lossless acceptance (accept with min(1, p/q),
resample from norm(max(p - q, 0))): the target samples each position as it would without
speculation and a draft is accepted when the two agree, so the output has the target's
distribution exactly, and greedy output equals non-speculative greedy.

Registry: ``DRAFTERS`` (the pure ones, built here); ``make_drafter(spec)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from runtime.engine.request import Request
from traces.speculation import num_accepted

MAX_SPECULATIVE_TOKENS = 16  # K: a verify span is 1 + K tokens
NGRAM_SIZES = (8, 6, 4, 3, 2)  # prompt lookup: the suffix lengths tried, longest first


@dataclass(frozen=True, slots=True)
class SpeculativeSpec:
    method: str  # a DRAFTERS name or "model"
    num_tokens: int  # K
    arg: str = ""  # the model's path for "model"

    def __str__(self) -> str:
        return f"{self.method}:{self.arg + ':' if self.arg else ''}{self.num_tokens}"


class SpeculativeError(ValueError):
    """A ``--speculative`` value that can't be used; the message says why."""


METHODS = ("ngram", "model")


def parse_speculative(text: str) -> SpeculativeSpec | None:
    """``""`` / ``"off"`` -> None; ``METHOD:K`` or ``METHOD:ARG:K`` -> the spec (SpeculativeError if not)."""
    if text in ("", "off"):
        return None
    method, _, rest = text.partition(":")
    arg, _, k = rest.rpartition(":")
    if method not in METHODS:
        raise SpeculativeError(f"must be off, ngram:K or model:PATH:K, got {text!r} (unknown method {method!r})")
    if not k.isdigit() or not 1 <= int(k) <= MAX_SPECULATIVE_TOKENS:
        raise SpeculativeError(f"K must be an integer from 1 to {MAX_SPECULATIVE_TOKENS}, got {text!r}")
    if (method == "model") != bool(arg):
        raise SpeculativeError("model:PATH:K names the draft model's path; ngram:K takes none, "
                               f"got {text!r}")
    return SpeculativeSpec(method, int(k), arg)


class Drafter(Protocol):
    """Proposes drafts for the decoding requests of a step, once per step, before it is budgeted."""

    num_tokens: int  # K: the most drafts a request is proposed

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        """Per request, at most ``limits[i]`` (<= K) token ids to follow its committed tokens
        (``token_ids``); fewer or none when there is nothing worth proposing."""
        ...


class _Track:
    """What a drafter remembers of one request: its last proposal (at which length), how well its
    proposals have fared lately, and whether it is quiet (its proposals kept back, only scored)."""

    __slots__ = ("request", "at", "drafts", "rate", "quiet")

    def __init__(self, request: Request) -> None:
        self.request, self.at, self.drafts, self.rate, self.quiet = request, 0, (), 1.0, False


class NgramDrafter:
    """Prompt lookup (``ngram:K``): see the module docstring. Backing off is a function of the
    request's own tokens (what was proposed against what was committed), so a run stays
    deterministic and its log reproducible."""

    name = "ngram"
    RATE_WEIGHT = 0.5  # of the latest proposal in the running acceptance rate
    MIN_RATE = 0.2  # below it the request goes quiet
    RESUME_RATE = 0.5  # a quiet request drafts again once its shadow proposals bring the rate here
    SHADOW_PROBE = 3  # a shadow proposal is scored on its first this many tokens (all guessed: a score of 1)

    def __init__(self, num_tokens: int, sizes: Sequence[int] = NGRAM_SIZES) -> None:
        self.num_tokens = num_tokens
        self.sizes = tuple(sizes)
        self._tracks: dict[int, _Track] = {}

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        out = []
        for req, n in zip(requests, limits):
            track = self._track(req)
            if n <= 0 or (track.quiet and track.drafts):  # (a shadow proposal still being scored)
                out.append([])
                continue
            length = len(req.token_ids)
            drafts = self.propose_one(req.token_ids, n)
            track.at, track.drafts = length, tuple(drafts)
            out.append([] if track.quiet else drafts)
        if len(self._tracks) > 2 * len(requests) + 64:  # forget the requests that are done
            self._tracks = {rid: t for rid, t in self._tracks.items() if not t.request.status.done}
        return out

    def _track(self, req: Request) -> _Track:
        """The request's track, its last proposal scored once what was committed since decides it:
        a verified one after its round (the share of its drafts accepted); a shadow one at its
        first wrong token, or once its first SHADOW_PROBE tokens are committed (the share of those
        it guessed)."""
        track = self._tracks.get(req.request_id)
        if track is None or track.request is not req:
            track = self._tracks[req.request_id] = _Track(req)
        elif track.drafts and len(req.token_ids) > track.at:  # (no new tokens: its round did not run)
            scored = min(len(track.drafts), self.SHADOW_PROBE) if track.quiet else len(track.drafts)
            committed = req.token_ids[track.at:track.at + scored]
            accepted = num_accepted(track.drafts, committed)
            if track.quiet and accepted == len(committed) < scored:
                return track  # a shadow proposal not decided yet
            w = self.RATE_WEIGHT
            track.rate = (1 - w) * track.rate + w * accepted / scored
            track.drafts = ()
            track.quiet = track.rate < (self.RESUME_RATE if track.quiet else self.MIN_RATE)
        return track

    def propose_one(self, tokens: Sequence[int], limit: int) -> list[int]:
        """The ``limit`` tokens after the latest earlier occurrence of the longest suffix that has one."""
        length = len(tokens)
        data = tokens.tobytes() if hasattr(tokens, "tobytes") else _int32_bytes(tokens)
        width = len(data) // length if length else 4
        for n in self.sizes:
            if n >= length:
                continue
            pattern = data[(length - n) * width:]
            end = (length - 1) * width  # an occurrence that ends before the last token: not the suffix itself
            while True:
                at = data.rfind(pattern, 0, end)
                if at < 0:
                    break
                if at % width == 0:  # on a token boundary (bytes of ids can match across them)
                    first = at // width + n
                    return list(tokens[first:first + limit])
                end = at + len(pattern) - 1
        return []


def _int32_bytes(tokens: Sequence[int]) -> bytes:
    from array import array

    return array("i", tokens).tobytes()


DRAFTERS = {"ngram": NgramDrafter}


def make_drafter(spec: SpeculativeSpec) -> Drafter:
    """The pure drafter of ``spec`` (``model`` is the executor's to build: it runs on the device)."""
    factory = DRAFTERS.get(spec.method)
    if factory is None:
        raise SpeculativeError(f"the {spec.method!r} drafter runs on the device: the executor builds it "
                               "(build_engine), an engine core alone can't")
    return factory(spec.num_tokens)
