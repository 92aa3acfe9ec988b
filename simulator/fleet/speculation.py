"""Speculative decoding in a simulation: drafts and their acceptance drawn from rates.

A simulation's token values are placeholders, so a real drafter's proposals on them would mean
nothing (the ngram drafter would find the same token repeated everywhere and every draft would
"match"); and a cost-model executor has no target to verify with. Instead, from rates
(traces/acceptance.py: a speculative log's, or a constant per-token rate):

- ``SimDrafter`` (the engine core's drafter in a simulation) proposes for a decode with probability
  ``proposal``, ``d`` drafts drawn from the size distribution for the config's K (capped at what
  the scheduler allows), each the placeholder ``DRAFT_TOKEN``; for a draft model's config (throttled
  live) a step whose requests draw no drafts next overlaps the next one, as live;
- the cost-model executor (simulator/fleet/executor.py) accepts draft j + 1 with ``alpha[j]`` after
  the first j were accepted and commits the accepted drafts and one token of its own
  (``SYNTHETIC_TOKEN``, which no draft equals: the log's ``num_accepted`` reads the acceptance back).

Every draw is a pure function of (seed, request id, the round's position, the draw's index), so a
run is deterministic and the same seed gives a byte-identical log; the position (the decode's
``start + 1``) names a request's round. Per request (``per_request``), each simulated request takes
the rates of the logged request with the same arrival time and prompt length (in arrival order),
and the workload's when none matches.

The engine core itself runs unchanged: the scheduler budgets 1 + d tokens, the core keeps the
accepted drafts' KV and trims the rest (runtime/engine/core.py), the cost model prices a verify
span as a span of 1 + d tokens (simulator/cost/features.py), and the log is a speculative log.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from runtime.engine.request import Request
from traces.acceptance import AcceptanceEstimate, AcceptanceRates, estimate

DRAFT_TOKEN = 1  # every simulated draft (the executor's own tokens are SYNTHETIC_TOKEN, 0)

_MASK = (1 << 64) - 1
_SCALE = 1.0 / (1 << 64)
_PROPOSE, _SIZE, _ACCEPT = 0, 1, 2  # draw indices within a round (acceptance: _ACCEPT + position)


def unit(seed: int, request_id: int, position: int, draw: int) -> float:
    """A uniform [0, 1) number, a pure function of its arguments (splitmix64 of their mix)."""
    x = (seed * 0x9E3779B97F4A7C15 + request_id * 0xD1B54A32D192ED03 + position * 0x8CB92BA72F3D8DD7
         + draw * 0xABC98388FB8FAC03 + 0x632BE59BD9B4E019) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) * _SCALE


@dataclass(frozen=True)
class Speculation:
    """What a simulation draws speculative rounds from: the workload's rates, optionally each
    request's (by (arrival time, prompt tokens)), and the seed."""

    rates: AcceptanceRates
    per_request: dict[tuple[float, int], list[AcceptanceRates]] | None = None
    seed: int = 0
    source: str = ""  # where the rates come from (a log, or "constant")
    recorded_k: int = 0  # the K the source log ran (0: a constant rate)

    @classmethod
    def from_estimate(cls, est: AcceptanceEstimate, *, per_request: bool = False, seed: int = 0) -> Speculation:
        return cls(est.workload_rates(), est.request_rates() if per_request else None, seed, est.source,
                   est.num_tokens)

    @classmethod
    def from_logs(cls, paths: Sequence[str | Path], *, per_request: bool = False, seed: int = 0) -> Speculation:
        """The rates of speculative logs (several: a fleet's replicas, one workload); ValueError
        when they recorded no speculative round."""
        est = AcceptanceEstimate.merged([estimate(p) for p in paths])
        if not est.workload.rounds:
            raise ValueError(f"{est.source}: the log recorded no speculative round (it ran "
                             + ("without speculative decoding" if not est.num_tokens else "with no drafts proposed")
                             + "): no acceptance rates to draw from")
        return cls.from_estimate(est, per_request=per_request, seed=seed)

    @classmethod
    def constant(cls, rate: float, *, seed: int = 0, proposal: float = 1.0) -> Speculation:
        return cls(AcceptanceRates.constant(rate, proposal), None, seed, "constant")

    @property
    def constant_rate(self) -> float | None:
        """The per-token rate of a constant source drafting at every decode (None: a log's rates)."""
        r = self.rates
        return r.alpha[0] if self.source == "constant" and r.proposal == 1.0 else None

    def fingerprint(self) -> str:
        """A digest of what the draws come from: the rates (each request's too) and the seed."""
        per = None if self.per_request is None else sorted(
            [arrival, prompt, [r.to_dict() for r in rates]] for (arrival, prompt), rates in self.per_request.items())
        doc = {"rates": self.rates.to_dict(), "per_request": per, "seed": self.seed}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def describe(self, k: int) -> str:
        """One line: where the rates come from and what they are at K = ``k``."""
        r = self.rates
        alphas = " ".join(f"{r.alpha_at(j):.2f}" for j in range(k))
        if self.source == "constant":
            where = "a constant rate"
        else:
            where = f"{self.source} ({'per request' if self.per_request is not None else 'per workload'}"
            where += f", recorded at K={self.recorded_k}" if self.recorded_k and self.recorded_k != k else ""
            where += ")"
        mean = sum((i + 1) * p for i, p in enumerate(r.sizes_for(k)))
        note = ""
        if self.recorded_k and k > self.recorded_k:
            note = (f"; positions past {self.recorded_k} reuse the last measured rate, a full proposal "
                    f"stays full")
        return (f"drafts and acceptance from {where}: a decode drafts {r.proposal:.0%} of the time, "
                f"{mean:.2f} drafts when it does; per-position acceptance {alphas}{note}")

    def header_extra(self) -> dict[str, Any]:
        return {"source": self.source, "per": "request" if self.per_request is not None else "workload",
                "seed": self.seed, "rates": self.rates.to_dict(), "recorded_k": self.recorded_k}

    def matcher(self) -> RateMatcher:
        """The per-request rates, claimed as requests are seen (one per simulation: its replicas share it)."""
        return RateMatcher(self)


class RateMatcher:
    """Hands each simulated request its rates: its matched logged request's, else the workload's."""

    def __init__(self, speculation: Speculation) -> None:
        self.speculation = speculation
        self._left = {key: list(reversed(v)) for key, v in (speculation.per_request or {}).items()}
        self.matched = self.unmatched = 0

    def claim(self, req: Request) -> AcceptanceRates:
        if self.speculation.per_request is None:
            return self.speculation.rates
        left = self._left.get((req.arrival_time, req.num_prompt_tokens))
        if left:
            self.matched += 1
            return left.pop()
        self.unmatched += 1
        return self.speculation.rates


@dataclass(slots=True)
class _Drawn:
    proposal: float
    sizes: list[float]  # cumulative P(d drafts), d = 1..K
    alpha: tuple[float, ...]  # per position, K of them


@dataclass
class RoundDraws:
    """One replica's draws: each request's rates (claimed when first drafted for), the proposals
    and the acceptances."""

    num_tokens: int  # the config's K
    matcher: RateMatcher
    seed: int
    _of: dict[int, _Drawn] = field(default_factory=dict)

    def _rates(self, req: Request) -> _Drawn:
        drawn = self._of.get(req.request_id)
        if drawn is None:
            r = self.matcher.claim(req)
            k = self.num_tokens
            drawn = self._of[req.request_id] = _Drawn(r.proposal, list(accumulate(r.sizes_for(k))),
                                                      tuple(r.alpha_at(j) for j in range(k)))
        return drawn

    def proposes(self, req: Request, position: int) -> bool:
        """Whether ``req``'s round at ``position`` (its decode's start + 1) is proposed drafts."""
        return self._proposes(self._rates(req), req.request_id, position)

    def _proposes(self, r: _Drawn, rid: int, position: int) -> bool:
        return bool(r.proposal) and unit(self.seed, rid, position, _PROPOSE) < r.proposal

    def drafts(self, req: Request, limit: int) -> int:
        """How many drafts ``req``'s decode is proposed (at most ``limit``)."""
        r = self._rates(req)
        position = len(req.token_ids)  # the decode's start + 1: the round's name
        rid, seed = req.request_id, self.seed
        if not self._proposes(r, rid, position):
            return 0
        sizes = r.sizes
        d = min(bisect_right(sizes, unit(seed, rid, position, _SIZE) * sizes[-1]), len(sizes) - 1) + 1
        return min(d, limit)

    def accepted(self, request_id: int, position: int, num_drafts: int) -> int:
        """How many of the ``num_drafts`` drafts at ``position`` (the first draft's) are accepted."""
        alpha = self._of[request_id].alpha
        seed, n = self.seed, 0
        while n < num_drafts and unit(seed, request_id, position, _ACCEPT + n) < alpha[n]:
            n += 1
        return n

    def forget(self, request_id: int) -> None:
        self._of.pop(request_id, None)


class SimDrafter:
    """The engine core's drafter in a simulation (runtime/engine/drafters.py's ``Drafter``):
    placeholder drafts, as many as ``RoundDraws`` says."""

    name = "simulated"

    def __init__(self, draws: RoundDraws, throttled: bool = False) -> None:
        """``throttled``: the live drafter it stands for is a ``ThrottledDrafter`` (a draft model's),
        whose stopped requests' steps overlap; an ngram drafter reads every token, so none does."""
        self.draws = draws
        self.num_tokens = draws.num_tokens
        self.throttled = throttled

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        drafts = self.draws.drafts
        return [[DRAFT_TOKEN] * drafts(r, n) if n > 0 else [] for r, n in zip(requests, limits)]

    def drafts_next(self, requests: Sequence[Request]) -> bool:
        """Whether any of ``requests`` is drawn drafts in its next round (after the token it samples
        now): for a throttled drafter, a round drawn none is planned before that token lands, as a
        live run overlaps the steps of its stopped requests."""
        if not self.throttled:
            return bool(requests)
        proposes = self.draws.proposes
        return any(proposes(r, len(r.token_ids) + 1) for r in requests)
