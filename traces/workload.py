"""Workload: what arrives when — request specs the simulator (or a load generator) replays.

A workload is a list of ``RequestSpec`` (arrival time in seconds, prompt record, sampling
params, priority) sorted by arrival. Trace workloads fix each output length with
``max_tokens`` + ``ignore_eos`` so the engine stops exactly where the trace did.

Saved as JSON Lines in the event-log format: a ``Header`` (clock ``"workload"``, provenance in
``extra``) followed by one ``Arrived`` event per request — so any log reader (and ``read_log``)
reads a workload file, and a recorded log is itself a workload source.

Importers (``traces/importers/``, registered by format in ``traces.formats``) and generators
(``traces.generators``) build workloads; ``traces.formats.load_workload`` reads any of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from traces.events import Arrived, Header
from traces.log import LogWriter
from traces.params import SamplingParams
from traces.prompt import Prompt, PromptIds, PromptSynthetic

WORKLOAD_CLOCK = "workload"
SESSIONS_KEY = "sessions"  # a saved workload's Header: the session of each turn


class WorkloadError(ValueError):
    """Malformed workload input; the message names the file, line and field."""


class RequestSpec(msgspec.Struct, frozen=True, kw_only=True):
    arrival: float  # seconds since the workload's time origin
    prompt: Prompt
    params: SamplingParams
    priority: int = 0
    cache_salt: str | None = None  # shares prefix blocks only with requests of the same salt
    # closed loop (traces/sessions.py): a turn of a conversation; it arrives no earlier than
    # ``arrival`` and ``think_time`` after the previous turn of its session finished
    session: int | None = None
    think_time: float = 0.0

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt.num_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.params.max_tokens


@dataclass
class Workload:
    requests: list[RequestSpec]
    seed: int = 0
    source: str = ""
    # provenance and import notes (skipped rows, excluded requests); saved in the Header
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # stable sort: equal arrival times keep their input order
        if any(b.arrival < a.arrival for a, b in zip(self.requests, self.requests[1:])):
            self.requests = sorted(self.requests, key=lambda r: r.arrival)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)

    @property
    def duration(self) -> float:
        """Seconds from the first to the last arrival."""
        return self.requests[-1].arrival - self.requests[0].arrival if self.requests else 0.0

    def max_request_tokens(self) -> int:
        """Longest prompt + output: the ``max_model_len`` that serves every request."""
        return max((r.num_prompt_tokens + r.num_output_tokens for r in self.requests), default=1)

    def _derive(self, requests: list[RequestSpec], note: str) -> Workload:
        meta = dict(self.meta)
        meta["transforms"] = [*meta.get("transforms", []), note]
        return Workload(requests, self.seed, self.source, meta)

    # --- slicing --------------------------------------------------------------------------------

    def head(self, n: int) -> Workload:
        """The first ``n`` requests by arrival."""
        if n < 0:
            raise WorkloadError(f"limit must be >= 0, got {n}")
        return self._derive(self.requests[:n], f"head({n})")

    def window(self, start: float, end: float, rebase: bool = True) -> Workload:
        """Requests arriving in ``[start, end)``; with ``rebase`` arrivals count from ``start``."""
        if not end > start:
            raise WorkloadError(f"time window end must be after its start, got [{start}, {end})")
        shift = start if rebase else 0.0
        picked = [msgspec.structs.replace(r, arrival=r.arrival - shift) if shift else r
                  for r in self.requests if start <= r.arrival < end]
        return self._derive(picked, f"window({start}, {end})")

    # --- scaling --------------------------------------------------------------------------------

    def scale_rate(self, factor: float) -> Workload:
        """Multiply the arrival rate by ``factor`` (inter-arrival gaps divided by it)."""
        if not factor > 0:
            raise WorkloadError(f"rate scale must be > 0, got {factor}")
        return self._derive([msgspec.structs.replace(r, arrival=r.arrival / factor) for r in self.requests],
                            f"scale_rate({factor})")

    def scale_lengths(self, input_factor: float = 1.0, output_factor: float = 1.0) -> Workload:
        """Scale prompt and output lengths (rounded, at least 1 token)."""
        if not (input_factor > 0 and output_factor > 0):
            raise WorkloadError(f"length scales must be > 0, got {input_factor}, {output_factor}")
        out = []
        for r in self.requests:
            prompt = _scale_prompt(r.prompt, input_factor) if input_factor != 1.0 else r.prompt
            params = r.params
            if output_factor != 1.0:
                n = max(1, round(params.max_tokens * output_factor))
                params = msgspec.structs.replace(params, max_tokens=n, min_tokens=min(params.min_tokens, n))
            out.append(msgspec.structs.replace(r, prompt=prompt, params=params))
        return self._derive(out, f"scale_lengths({input_factor}, {output_factor})")

    # --- persistence ------------------------------------------------------------------------------

    @property
    def closed_loop(self) -> bool:
        """Some requests are turns that wait for the previous turn of their session."""
        return any(r.session is not None for r in self.requests)

    def header(self) -> Header:
        info = {"source": self.source, "num_requests": len(self), **self.meta}
        if self.closed_loop:  # [index, session, think_time] of every turn (an Arrived event has no place for them)
            info[SESSIONS_KEY] = [[i, r.session, r.think_time] for i, r in enumerate(self.requests)
                                  if r.session is not None]
        return Header(clock=WORKLOAD_CLOCK, seed=self.seed, extra={"workload": info})

    def events(self) -> Iterator[Header | Arrived]:
        yield self.header()
        for i, r in enumerate(self.requests):
            yield Arrived(time=r.arrival, request_id=i, prompt=r.prompt, params=r.params, priority=r.priority,
                          cache_salt=r.cache_salt)

    def save(self, path: str | Path) -> None:
        with LogWriter(path) as writer:
            for event in self.events():
                writer(event)


def _scale_prompt(prompt: Prompt, factor: float) -> Prompt:
    n = max(1, round(prompt.num_tokens * factor))
    if isinstance(prompt, PromptIds):
        if n > prompt.num_tokens:
            raise WorkloadError("cannot scale a token-id prompt up: its extra tokens are unknown")
        return PromptIds(prompt.token_ids[:n])
    # synthetic: keep the leading segments that still fit; tokens past them stay unique
    keep = math.ceil(n / prompt.segment_len)
    return msgspec.structs.replace(prompt, num_tokens=n, segment_ids=prompt.segment_ids[:keep])


def trace_params(output_tokens: int) -> SamplingParams:
    """Sampling params of a trace request: exactly ``output_tokens`` tokens, eos ignored."""
    return SamplingParams(max_tokens=output_tokens, ignore_eos=True)


def synthetic_prompt(num_tokens: int, seed: int, unique_seed: int, segment_ids: Iterable[int] = (),
                     segment_len: int = 512) -> PromptSynthetic:
    return PromptSynthetic(num_tokens=num_tokens, seed=seed, unique_seed=unique_seed,
                           segment_ids=list(segment_ids), segment_len=segment_len)
