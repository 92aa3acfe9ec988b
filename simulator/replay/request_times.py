"""Per-request latencies of a run, folded from its events as they stream by (a log sink).

The definitions are analysis/metrics.py's (the simulator may not import it), plus ITL:
  TTFT   end of the step that sampled the first token - arrival
  TPOT   (finish - first token) / (output tokens - 1), finished requests with >= 2 tokens
  ITL    time between consecutive sampled tokens of a request (every gap, pooled)
  E2E    finish - arrival (finished requests)
  queue  first admission - arrival
  prefill  end of the step that sampled the first token - first admission (TTFT = queue + prefill):
         the wait for the step in flight (async scheduling: a prefill step's launch holds it back),
         then the steps that compute the prompt
Aborted requests are left out (a re-simulated workload leaves them out too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator.cost.logged_run import LoggedRun
from traces.events import Aborted, Admitted, Arrived, Event, Finished, Step
from traces.fleet_log import FleetLog, is_fleet
from traces.log import read_header, read_log

METRICS = ("ttft", "tpot", "itl", "e2e", "queue", "prefill")


@dataclass
class RequestTimes:
    arrival: dict[int, float] = field(default_factory=dict)
    admitted: dict[int, float] = field(default_factory=dict)
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    finish: dict[int, tuple[float, int]] = field(default_factory=dict)  # time, output tokens
    aborted: set[int] = field(default_factory=set)
    itl: list[float] = field(default_factory=list)
    itl_owner: list[int] = field(default_factory=list)
    steps: int = 0
    first_start: float = float("inf")
    last_end: float = float("-inf")
    busy: float = 0.0

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, Step):
            end = ev.end
            self.steps += 1
            self.busy += end - ev.start
            self.first_start = min(self.first_start, ev.start)
            self.last_end = max(self.last_end, end)
            first, last = self.first, self.last
            for s in ev.spans:
                if s.sample:
                    rid = s.request_id
                    prev = last.get(rid)
                    if prev is None:
                        first[rid] = end
                    else:
                        self.itl.append(end - prev)
                        self.itl_owner.append(rid)
                    last[rid] = end
        elif isinstance(ev, Arrived):
            self.arrival[ev.request_id] = ev.time
        elif isinstance(ev, Admitted):
            self.admitted.setdefault(ev.request_id, ev.time)
        elif isinstance(ev, Finished):
            self.finish[ev.request_id] = (ev.time, ev.num_output_tokens)
        elif isinstance(ev, Aborted):
            self.aborted.add(ev.request_id)

    write = __call__

    def values(self) -> dict[str, np.ndarray]:
        """Per metric, the values over requests (ITL: over token gaps)."""
        out: dict[str, list[float]] = {m: [] for m in METRICS}
        for rid, t0 in self.arrival.items():
            if rid in self.aborted:
                continue
            if rid in self.first:
                out["ttft"].append(self.first[rid] - t0)
            if rid in self.admitted:
                out["queue"].append(self.admitted[rid] - t0)
                if rid in self.first:
                    out["prefill"].append(self.first[rid] - self.admitted[rid])
            if rid in self.finish:
                t, n = self.finish[rid]
                out["e2e"].append(t - t0)
                if n >= 2 and rid in self.first:
                    out["tpot"].append((t - self.first[rid]) / (n - 1))
        out["itl"] = [g for g, rid in zip(self.itl, self.itl_owner) if rid not in self.aborted]
        return {k: np.asarray(v, dtype=float) for k, v in out.items()}

    def by_request(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request, in arrival order: arrival time, TTFT and queueing time (NaN where it never
        got a first token or was never admitted); aborted requests left out, as in ``values``."""
        ids = sorted((rid for rid in self.arrival if rid not in self.aborted), key=self.arrival.__getitem__)
        arrival = np.asarray([self.arrival[rid] for rid in ids], dtype=float)
        first = np.asarray([self.first.get(rid, np.nan) for rid in ids], dtype=float)
        admitted = np.asarray([self.admitted.get(rid, np.nan) for rid in ids], dtype=float)
        return arrival, first - arrival, admitted - arrival

    @property
    def makespan(self) -> float:
        """Last step end - first arrival (analysis.metrics' definition)."""
        arrivals = [t for rid, t in self.arrival.items() if rid not in self.aborted]
        if not arrivals or self.last_end == float("-inf"):
            return 0.0
        return self.last_end - min(arrivals)

    @property
    def requests(self) -> int:
        return len(self.arrival) - len(self.aborted & set(self.arrival))

    @classmethod
    def merged(cls, parts: list[RequestTimes]) -> RequestTimes:
        """A fleet's times: its replicas' requests under ids of their own (replica i's id r as
        ``i << 40 | r``), their steps and busy time summed."""
        out = cls()
        for i, part in enumerate(parts):
            base = i << 40
            for name in ("arrival", "admitted", "first", "last", "finish"):
                getattr(out, name).update({base | rid: v for rid, v in getattr(part, name).items()})
            out.aborted |= {base | rid for rid in part.aborted}
            out.itl += part.itl
            out.itl_owner += [base | rid for rid in part.itl_owner]
            out.steps += part.steps
            out.busy += part.busy
            out.first_start = min(out.first_start, part.first_start)
            out.last_end = max(out.last_end, part.last_end)
        return out


def times_of_log(log: str | Path | LoggedRun) -> RequestTimes:
    """The per-request times of a recorded log, a path or a log already read (of a fleet's logs,
    for a fleet log)."""
    path = log.path if isinstance(log, LoggedRun) else log
    if is_fleet(log.header if isinstance(log, LoggedRun) else read_header(path)):
        return RequestTimes.merged([times_of_log(p) for p in FleetLog.read(path).replica_logs])
    times = RequestTimes()
    for ev in log.events if isinstance(log, LoggedRun) else read_log(path):
        times(ev)
    return times
