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
  followed it are its continuation: a longer suffix picks, of the places a short phrase recurs,
  the one that continues as the text does now (in a loop of "it was the age of X, ..." the last
  loop, not the latest "the age of"). Deterministic, pure Python, nothing to load. How much of
  the continuation is proposed depends on how much the match is worth: every continuation is
  scored against the tokens the request then commits (verified or not, so scoring is free), per
  match length and position, and a proposal stops at the first position whose odds of being
  kept (the product of the positions' keep rates so far) fall below MIN_KEEP. A verified draft
  is compute, and a rejected one buys nothing: on text that does not repeat itself a two-token
  match is kept about a third of the time and the next position far less (one draft, or none),
  while an eight-token match keeps most of its K (measured on the default model, open text).
- ``model:PATH:K``: a small draft model (any model the loader reads that shares the target's
  tokenizer), its greedy continuation: built by the executor (runtime/executor/draft_model.py),
  since it runs on the device, and throttled per request by how many of its drafts are kept
  (``ThrottledDrafter``): a request it cannot predict stops costing verify steps.

A deterministic drafter is the one-hot case of lossless acceptance (accept with min(1, p/q),
resample from norm(max(p - q, 0))): the target samples each position as it would without
speculation and a draft is accepted when the two agree, so the output has the target's
distribution exactly, and greedy output equals non-speculative greedy.

Registry: ``DRAFTERS`` (the pure ones, built here); ``make_drafter(spec)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from runtime.engine.request import Request
from runtime.engine.types import StepPlan
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
    """Proposes drafts for the decoding requests of a step, once per step, before it is budgeted.
    A drafter may also say, by a method ``drafts_next(requests) -> bool``, whether it may propose
    for any of ``requests`` in the step after the one sampling their next tokens (``may_draft_next``):
    while it may not, that step is planned before those tokens land, as without speculation."""

    num_tokens: int  # K: the most drafts a request is proposed

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        """Per request, at most ``limits[i]`` (<= K) token ids to follow its committed tokens
        (``token_ids``); fewer or none when there is nothing worth proposing."""
        ...


def may_draft_next(drafter: Drafter, plan: StepPlan, requests: Mapping[int, Request]) -> bool:
    """Whether the step after ``plan`` may propose drafts that follow the tokens ``plan`` samples
    (``requests``: by id): always after a verify step (how many drafts it keeps is known only
    then), else as ``drafter.drafts_next`` says (a drafter without it: always)."""
    ask = getattr(drafter, "drafts_next", None)
    if plan.drafts or ask is None:
        return True
    return ask([requests[s.request_id] for s in plan.spans if s.sample])


class MatchOdds:
    """How often a continuation's position j is kept, given positions < j were, per match length:
    counts that fade (each score weighs the earlier ones by MEMORY: a workload that changes is
    followed within a few hundred continuations) with a prior (PRIOR_TRIES tries at PRIOR_KEEP).
    ``length`` is how far a proposal of a given match length is worth verifying."""

    PRIOR_KEEP = 0.75
    PRIOR_TRIES = 2.0
    MEMORY = 0.99

    def __init__(self, sizes: Sequence[int], num_tokens: int, min_keep: float) -> None:
        self.min_keep = min_keep
        self.tried = {n: [0.0] * num_tokens for n in sizes}
        self.kept = {n: [0.0] * num_tokens for n in sizes}

    def score(self, size: int, kept: int, tried: int) -> None:
        """A continuation of a ``size``-token match: its first ``kept`` positions came true, and
        ``tried`` positions are decided (``kept`` + 1 when one came out wrong)."""
        t, k, m = self.tried[size], self.kept[size], self.MEMORY
        for j in range(tried):
            t[j] = t[j] * m + 1
            k[j] = k[j] * m + (j < kept)

    def length(self, size: int, limit: int) -> int:
        """The most positions (<= ``limit``) whose odds of all being kept stay at MIN_KEEP or above."""
        t, k = self.tried[size], self.kept[size]
        odds, n = 1.0, 0
        while n < limit:
            odds *= (k[n] + self.PRIOR_KEEP * self.PRIOR_TRIES) / (t[n] + self.PRIOR_TRIES)
            if odds < self.min_keep:
                break
            n += 1
        return n


class NgramDrafter:
    """Prompt lookup (``ngram:K``): see the module docstring. The odds are a function of the
    requests' own tokens (what was looked up against what was committed), so a run stays
    deterministic and its log reproducible."""

    name = "ngram"
    # a draft is verified while its odds of being kept are at least this: on a 2-core CPU at
    # batch 8 a verified draft costs ~1.5 ms beside a step of ~50 ms, i.e. a quarter of what a
    # decode token's share of the step buys; on a GPU drafts are cheaper, and a draft less
    # likely than this to be kept adds little there either
    MIN_KEEP = 0.3

    def __init__(self, num_tokens: int, sizes: Sequence[int] = NGRAM_SIZES) -> None:
        self.num_tokens = num_tokens
        self.sizes = tuple(sizes)
        self.odds = MatchOdds(self.sizes, num_tokens, self.MIN_KEEP)
        # per request: itself, and its continuations not yet decided: (length then, match length, tokens)
        self._open: dict[int, tuple[Request, list[tuple[int, int, list[int]]]]] = {}

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        out = []
        for req, limit in zip(requests, limits):
            if limit <= 0:
                out.append([])
                continue
            pending = self._pending(req)
            tokens = req.token_ids
            size, continuation = self.lookup(tokens, self.num_tokens)
            if not continuation:
                out.append([])
                continue
            pending.append((len(tokens), size, continuation))
            out.append(continuation[: self.odds.length(size, limit)])
        if len(self._open) > 2 * len(requests) + 64:  # forget the requests that are done
            self._open = {rid: o for rid, o in self._open.items() if not o[0].status.done}
        return out

    def _pending(self, req: Request) -> list[tuple[int, int, list[int]]]:
        """The request's undecided continuations, those that what it committed since decides scored
        (at their first wrong token, or once all their tokens are committed) and dropped."""
        entry = self._open.get(req.request_id)
        if entry is None or entry[0] is not req:
            entry = self._open[req.request_id] = (req, [])
        pending = entry[1]
        tokens = req.token_ids
        undecided = []
        for at, size, continuation in pending:
            committed = tokens[at:at + len(continuation)]
            kept = num_accepted(continuation, committed)
            if kept < len(committed):  # a wrong token
                self.odds.score(size, kept, kept + 1)
            elif kept == len(continuation):
                self.odds.score(size, kept, kept)
            else:
                undecided.append((at, size, continuation))
        pending[:] = undecided
        return pending

    def lookup(self, tokens: Sequence[int], limit: int) -> tuple[int, list[int]]:
        """The length of the longest suffix that occurred before and the ``limit`` tokens after its
        latest earlier occurrence ((0, []) when none did)."""
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
                    return n, list(tokens[first:first + limit])
                end = at + len(pattern) - 1
        return 0, []


class _Record:
    """One request's drafts under ``ThrottledDrafter``: faded counts of positions kept and tried,
    the proposal not decided yet (where it was made, its tokens), and when a stopped request
    tries one draft again."""

    __slots__ = ("request", "kept", "tried", "pending", "resume_at", "backoff")

    def __init__(self, request: Request, backoff: int) -> None:
        self.request = request
        self.kept = self.tried = 0.0
        self.pending: tuple[int, list[int]] | None = None
        self.resume_at: int | None = None  # stopped: the length at which it drafts one token again
        self.backoff = backoff


class ThrottledDrafter:
    """Any drafter, each request proposed only as many drafts as its own drafts have earned: a
    verified draft that is rejected costs the step and buys nothing, so a request whose drafts keep
    failing drafts less, then stops, and tries one draft again after 16, 32, … 256 tokens.

    Each proposal is scored against the tokens the request then commits (verified or not): its
    positions kept and tried fade by MEMORY a proposal, with a prior of PRIOR_TRIES tries all kept.
    A request is proposed the most drafts whose odds of all being kept (the keep rate to that power)
    stay at MIN_KEEP or above. The inner drafter is not asked for a request given none, so a draft
    model stops running for it, and while none of a step's requests may draft next, the step after
    it is planned before its tokens land (``drafts_next``): a stopped request decodes as it would
    without speculation. Everything is a function of the requests' own tokens: a run stays
    deterministic and its log reproducible."""

    MIN_KEEP = 0.1
    MEMORY = 0.9
    PRIOR_TRIES = 0.5
    FIRST_RETRY, LAST_RETRY = 16, 256  # tokens a stopped request decodes before one draft again

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.num_tokens = inner.num_tokens
        self._records: dict[int, _Record] = {}

    def __getattr__(self, name: str):  # the inner drafter's own (its spec, stats, name)
        if name == "inner":  # (not set yet: being copied)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def reset(self) -> None:
        self._records.clear()
        reset = getattr(self.inner, "reset", None)
        if reset is not None:
            reset()

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        records = [self._record(req) for req in requests]
        caps = [min(limit, self._length(rec, len(req.token_ids)))
                for req, rec, limit in zip(requests, records, limits)]
        out: list[list[int]] = [[] for _ in requests]
        asked = [i for i, cap in enumerate(caps) if cap]
        if not asked:
            return out
        proposed = self.inner.propose([requests[i] for i in asked], [caps[i] for i in asked])
        for i, drafts in zip(asked, proposed):
            req, rec = requests[i], records[i]
            length = len(req.token_ids)
            out[i] = drafts = list(drafts[:caps[i]])
            if drafts:
                rec.pending = (length, drafts)
            elif rec.resume_at is not None and length >= rec.resume_at:  # a retry with nothing to try: failed
                rec.backoff = min(2 * rec.backoff, self.LAST_RETRY)
                rec.resume_at = length + rec.backoff
        if len(self._records) > 2 * len(requests) + 64:  # forget the requests that are done
            self._records = {rid: r for rid, r in self._records.items() if not r.request.status.done}
        return out

    def drafts_next(self, requests: Sequence[Request]) -> bool:
        for req in requests:
            rec = self._records.get(req.request_id)
            if rec is None or rec.request is not req or rec.pending is not None:
                return True
            if self._keep(rec) >= self.MIN_KEEP or (rec.resume_at is not None
                                                    and len(req.token_ids) + 1 >= rec.resume_at):
                return True
        return False

    def _record(self, req: Request) -> _Record:
        """The request's record, its pending proposal scored once what it committed decides it."""
        rec = self._records.get(req.request_id)
        if rec is None or rec.request is not req:
            rec = self._records[req.request_id] = _Record(req, self.FIRST_RETRY)
        if rec.pending is not None:
            at, drafts = rec.pending
            committed = req.token_ids[at:at + len(drafts)]
            kept = num_accepted(drafts, committed)
            if kept < len(committed) or kept == len(drafts):  # a wrong token, or all came true
                rec.kept = rec.kept * self.MEMORY + kept
                rec.tried = rec.tried * self.MEMORY + kept + (kept < len(drafts))
                rec.pending = None
                if rec.resume_at is not None:  # that was a retry
                    rec.backoff = self.FIRST_RETRY if kept else min(2 * rec.backoff, self.LAST_RETRY)
                    rec.resume_at = None
            elif not committed:  # it has not moved since: the proposal was not verified
                rec.pending = None
        return rec

    def _keep(self, rec: _Record) -> float:
        """The request's rate of drafts kept (positions kept / tried, faded, with the prior)."""
        return (rec.kept + self.PRIOR_TRIES) / (rec.tried + self.PRIOR_TRIES)

    def _odds_length(self, rec: _Record) -> int:
        keep = self._keep(rec)
        odds, n = 1.0, 0
        while n < self.num_tokens:
            odds *= keep
            if odds < self.MIN_KEEP:
                break
            n += 1
        return n

    def _length(self, rec: _Record, length: int) -> int:
        """How many drafts the request is worth now (its length is ``length``): by its odds, else
        one when its retry is due."""
        n = self._odds_length(rec)
        if n:
            rec.resume_at = None
            return n
        if rec.resume_at is None:
            rec.resume_at = length + rec.backoff
        return 1 if length >= rec.resume_at else 0


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
