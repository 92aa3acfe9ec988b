"""How well a speculating engine's drafts fared, estimated from its log: what the simulator draws
drafts and acceptances from (simulator/fleet/speculation.py) and what ``minivllm analyze`` reports.

A *decode* is a sampling span with one token of its own (``num_tokens - len(drafts) == 1``: the
scheduler's decode, the span its drafter is asked about) whose request had room for a draft
(``max_total_tokens - (start + 1) > 1``: a request one token from its length is asked for none).
Of the decodes, a *round* is one that verified drafts (traces/speculation.py's ``rounds``). From
them, per workload and per request:

- ``proposal``: P(a decode gets drafts) = rounds / decodes;
- ``sizes``: P(d drafts | it got some), d = 1..K, over the rounds whose request had room for all
  K (a round near its request's end is capped, not short of ideas);
- ``alpha[j]`` = P(draft j+1 accepted | drafts 1..j accepted) = accepted at j / tried at j, where
  position j is tried by a round with more than j drafts that accepted its first j. A round whose
  committed tokens are all accepted drafts (a stop ended the request inside the accepted run)
  tells nothing of the position after its last token: it is not counted as tried there.

Not seen in a log, so not estimated: the drafts the scheduler cut to fit the step's token budget
(a budget-cut round counts as a shorter proposal).

For another K (``AcceptanceRates.sizes_for(k)``, ``alpha_at(j)``): a smaller K cuts the proposals to k
drafts (the mass of the longer ones lands on k); a larger one keeps a full proposal full (k drafts:
the drafter had K to offer whenever it offered K) and the positions past the recorded ones reuse
the last rate that was measured. Both are assumptions, stated wherever a simulation uses them.

Per request, a position (or a proposal rate, or a size distribution) the request itself never
measured takes the workload's. Requests are matched to a workload's by (arrival time, prompt
length), in arrival order: a re-simulated log's requests arrive at their logged times.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from traces.events import Arrived, Event, Header, Step
from traces.log import read_log
from traces.speculation import num_accepted, span_drafts


def parse_rate(text: str) -> float:
    """A rate in [0, 1] from its text (ValueError naming the value where it is not one)."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"a rate must lie in [0, 1], got {text}")
    return value


def speculative_tokens(config: dict) -> int:
    """K of a log's Header config (0: it did not speculate). ``METHOD:K`` / ``METHOD:ARG:K``."""
    text = str(config.get("speculative") or "")
    k = text.rpartition(":")[2]
    return int(k) if text and k.isdigit() else 0


@dataclass
class AcceptanceCounts:
    """The counts the rates come from (additive: a workload's are the sum of its requests')."""

    decodes: int = 0  # decodes with room for a draft
    rounds: int = 0  # of those, the ones that verified drafts
    draft_tokens: int = 0  # drafts the rounds verified
    accepted_tokens: int = 0  # of those, accepted
    round_tokens: int = 0  # tokens the rounds committed (accepted drafts and one each, less stops)
    decode_tokens: int = 0  # tokens every decode committed, speculating or not
    sizes: list[int] = field(default_factory=list)  # sizes[d - 1]: rounds of d drafts with room for K
    tried: list[int] = field(default_factory=list)  # per position j: rounds that tried draft j + 1
    accepted: list[int] = field(default_factory=list)  # per position j: of those, accepted it

    def add_decode(self, committed: int) -> None:
        self.decodes += 1
        self.decode_tokens += committed

    def add_round(self, drafts: int, tokens: int, accepted: int, full_room: bool) -> None:
        self.rounds += 1
        self.draft_tokens += drafts
        self.accepted_tokens += accepted
        self.round_tokens += tokens
        if full_room:
            _bump(self.sizes, drafts - 1)
        stopped = tokens <= accepted  # no token of its own: a stop cut the round inside its accepted drafts
        for j in range(accepted):
            _bump(self.tried, j)
            _bump(self.accepted, j)
        if accepted < drafts and not stopped:
            _bump(self.tried, accepted)

    def merge(self, other: AcceptanceCounts) -> None:
        for name in ("decodes", "rounds", "draft_tokens", "accepted_tokens", "round_tokens", "decode_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("sizes", "tried", "accepted"):
            mine = getattr(self, name)
            for i, n in enumerate(getattr(other, name)):
                _bump(mine, i, n)


def _bump(counts: list[int], i: int, n: int = 1) -> None:
    if len(counts) <= i:
        counts.extend([0] * (i + 1 - len(counts)))
    counts[i] += n


@dataclass(frozen=True)
class AcceptanceRates:
    """Rates to draw from: ``proposal``, ``sizes`` (P(d drafts | drafted) at the recorded K, d = 1..K)
    and ``alpha`` (per position, as long as measured)."""

    proposal: float
    sizes: tuple[float, ...]
    alpha: tuple[float, ...]

    @property
    def num_tokens(self) -> int:
        """The K the sizes are of."""
        return len(self.sizes)

    def alpha_at(self, j: int) -> float:
        """P(draft j + 1 accepted | drafts 1..j accepted); past the measured positions, the last one's."""
        alpha = self.alpha
        if not alpha:
            return 0.0
        return alpha[j] if j < len(alpha) else alpha[-1]

    def sizes_for(self, k: int) -> tuple[float, ...]:
        """P(d drafts | drafted), d = 1..k, for a drafter of K = k (module docstring)."""
        sizes = self.sizes
        if not sizes:
            return (0.0,) * (k - 1) + (1.0,)
        if k <= len(sizes):
            return sizes[:k - 1] + (sum(sizes[k - 1:]),)
        return sizes[:-1] + (0.0,) * (k - len(sizes)) + (sizes[-1],)

    def to_dict(self) -> dict:
        return {"proposal": self.proposal, "sizes": list(self.sizes), "alpha": list(self.alpha)}

    @classmethod
    def constant(cls, rate: float, proposal: float = 1.0) -> AcceptanceRates:
        """Every decode proposes K drafts (``proposal``: how often), each accepted with ``rate`` after
        the ones before it (``--acceptance RATE``)."""
        if not 0.0 <= rate <= 1.0 or not 0.0 <= proposal <= 1.0:
            raise ValueError(f"acceptance and proposal rates must lie in [0, 1], got {rate} and {proposal}")
        return cls(proposal, (1.0,), (rate,))


def rates_of(counts: AcceptanceCounts, fallback: AcceptanceRates | None = None) -> AcceptanceRates:
    """The rates of ``counts``; what they never measured from ``fallback`` (else: no drafts, 0)."""
    if counts.decodes:
        proposal = counts.rounds / counts.decodes
    else:
        proposal = fallback.proposal if fallback is not None else 0.0
    total = sum(counts.sizes)
    if total:
        sizes = tuple(n / total for n in counts.sizes)
    else:
        sizes = fallback.sizes if fallback is not None else ()
    # a position is tried only after the one before it was accepted: the measured ones are a prefix
    tried, hits = counts.tried, counts.accepted
    alpha = [(hits[j] if j < len(hits) else 0) / tried[j] for j in range(len(tried))]
    if fallback is not None:
        alpha += [fallback.alpha_at(j) for j in range(len(alpha), len(fallback.alpha))]
    return AcceptanceRates(proposal, sizes, tuple(alpha))


@dataclass
class AcceptanceEstimate:
    """A speculative log's counts: the workload's and each request's, in arrival order."""

    num_tokens: int  # K the log ran (0: it did not speculate)
    workload: AcceptanceCounts
    # per request, in arrival order: ((arrival time, prompt tokens), its counts)
    requests: list[tuple[tuple[float, int], AcceptanceCounts]]
    source: str = ""

    def workload_rates(self) -> AcceptanceRates:
        return rates_of(self.workload)

    def request_rates(self) -> dict[tuple[float, int], list[AcceptanceRates]]:
        """Per (arrival time, prompt tokens), the rates of the requests with that key in arrival
        order (each request's own; what it never measured, the workload's)."""
        base = self.workload_rates()
        out: dict[tuple[float, int], list[AcceptanceRates]] = {}
        for key, counts in self.requests:
            out.setdefault(key, []).append(rates_of(counts, base))
        return out

    @classmethod
    def merged(cls, parts: list[AcceptanceEstimate]) -> AcceptanceEstimate:
        """Several logs' counts as one workload's (a fleet's replicas), requests by arrival."""
        workload = AcceptanceCounts()
        for p in parts:
            workload.merge(p.workload)
        requests = sorted((r for p in parts for r in p.requests), key=lambda r: r[0][0])
        return cls(max((p.num_tokens for p in parts), default=0), workload, requests,
                   ", ".join(p.source for p in parts if p.source))


def estimate(events_or_path: str | Path | Iterable[Event]) -> AcceptanceEstimate:
    """Count a log's decodes and rounds (module docstring); a log that did not speculate has none."""
    is_path = isinstance(events_or_path, str | Path)
    events = read_log(events_or_path) if is_path else events_or_path
    k = 0
    max_model_len = 1 << 62
    workload = AcceptanceCounts()
    per: dict[int, AcceptanceCounts] = {}
    keys: dict[int, tuple[float, int]] = {}
    max_total: dict[int, int] = {}
    for ev in events:
        if type(ev) is Step:
            if not ev.drafts and not k:
                continue
            tokens = iter(ev.tokens)
            for s, drafts in zip(ev.spans, span_drafts(ev)):
                if not s.sample:
                    continue
                committed = next(tokens)
                d = len(drafts)
                if s.num_tokens - d != 1:
                    continue  # a prefill's last chunk
                rid = s.request_id
                room = max_total.get(rid, max_model_len) - (s.start + 1) - 1
                if room <= 0:
                    continue
                counts = per.get(rid)
                if counts is None:
                    counts = per[rid] = AcceptanceCounts()
                n = len(committed)
                counts.add_decode(n)
                if d:
                    counts.add_round(d, n, num_accepted(drafts, committed), room >= k)
        elif type(ev) is Arrived:
            n = ev.prompt.num_tokens
            keys[ev.request_id] = (ev.time, n)
            max_total[ev.request_id] = min(n + ev.params.max_tokens, max_model_len)
        elif type(ev) is Header:
            k = speculative_tokens(ev.config)
            max_model_len = int((ev.config.get("scheduler") or {}).get("max_model_len", max_model_len))
    empty = AcceptanceCounts()
    for counts in per.values():
        workload.merge(counts)
    requests = [(key, per.get(rid, empty)) for rid, key in keys.items()]  # (Arrived order: arrival order)
    return AcceptanceEstimate(k, workload, requests, str(events_or_path) if is_path else "")
