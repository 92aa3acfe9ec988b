"""Engine time outside the step: host work between steps, waking from idle, the front door's delay.

A live log's steps do not tile its timeline. Between step k's end and step k+1's start the host
commits k, hands out its tokens (detokenizing, streaming), takes arrivals in and schedules k+1;
after idle, the arrival that wakes the engine reaches it some time after it was stamped. A
simulation that charges only step durations runs ahead of the live engine by all of that. So a
fitted model carries, besides its step model:

  gap          seconds between two back-to-back steps: ``const + per_seq · spans + per_draft · drafts``
               of the previous step (least squares over the busy gaps of the training logs: the
               mean, so total time holds); a step that verified drafts leaves more to commit (the
               accepted tokens, the rejected ones' KV) and its requests' next drafts to propose, so
               a plain engine's gaps are not priced at a speculating one's
  wake         seconds from the moment an idle engine could see a request to its first step
  intake_delay seconds from a request's arrival stamp (the front door) to the engine seeing it; a
               request that arrives while a step runs but is not taken in before the next schedule
               shows it: the log records Arrived when the engine takes a request in
  overlap      steps overlap (async scheduling on CUDA: step k+1 is planned while k runs), as the
               logs' headers say their loop ran (``extra.overlap``; an older log without it: its busy
               steps tile): consecutive steps then tile, gaps are 0 and a step costs
               ``max(host, device) + launch``, the host part being what ``gap`` measured on sequential runs
  eager_launch the host time to plan and launch a step that carries prefill (no CUDA graph: its
               kernels go one by one), ``eager_launch + eager_launch_per_token · extra tokens``
               (tokens beyond one per span); with overlap it holds back the end of the step in
               flight (simulator/cost/launch.py)

The front door's delay by prompt length, from a probe's log, is in front_door_fit.py.

``HostData.from_log`` separates busy gaps from wakes the way RecordedCostModel does (an engine is
idle when every request that arrived so far has finished).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from simulator.cost.logged_run import LoggedRun, LogPath, read_runs
from traces.events import Aborted, Arrived, Finished, Step

# consecutive steps whose start equals the previous end exactly: the log of an overlapped engine
OVERLAP_SHARE = 0.9


@dataclass(frozen=True)
class HostTiming:
    gap_const: float = 0.0
    gap_per_seq: float = 0.0
    gap_per_draft: float = 0.0
    wake: float = 0.0
    intake_delay: float = 0.0
    intake_service: float = 0.0  # the front door's worker: requests closer together than this queue
    intake_per_token: float = 0.0  # the front door's delay per prompt token (a front-door probe's fit)
    overlap: bool = False
    launch: float = 0.0
    eager_launch: float = 0.0
    eager_launch_per_token: float = 0.0
    fitted_from: dict[str, Any] = field(default_factory=dict)

    def gap(self, previous_spans: int | None, previous_drafts: int = 0) -> float:
        """Engine time before scheduling: after a step of ``previous_spans`` spans verifying
        ``previous_drafts`` drafts, or (None) after idle."""
        if previous_spans is None:
            return self.wake
        if self.overlap:
            return 0.0
        return self.gap_const + self.gap_per_seq * previous_spans + self.gap_per_draft * previous_drafts

    def eager_launch_time(self, extra_tokens: int) -> float:
        """Host time to plan and launch a step with ``extra_tokens`` tokens beyond one per span
        (0: a decode-only step, replayed from a CUDA graph, whose launch hides behind the device)."""
        return self.eager_launch + self.eager_launch_per_token * extra_tokens if extra_tokens else 0.0

    def host_time(self, spans: int) -> float:
        """Host work of one step (what runs beside the device when steps overlap)."""
        return self.gap_const + self.gap_per_seq * spans

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostTiming:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        timing = cls(**known)
        for name in ("gap_const", "gap_per_seq", "gap_per_draft", "wake", "intake_delay", "intake_service",
                     "intake_per_token", "launch", "eager_launch", "eager_launch_per_token"):
            if not float(getattr(timing, name)) >= 0:
                raise ValueError(f"host.{name} must be >= 0")
        return timing


@dataclass
class HostData:
    """Gaps of one or more logs: busy gaps with the span count of the step before, wakes, intake lags."""

    busy_gaps: list[float] = field(default_factory=list)
    busy_spans: list[int] = field(default_factory=list)
    busy_drafts: list[int] = field(default_factory=list)  # drafts the step before verified
    wakes: list[float] = field(default_factory=list)
    intake_lags: list[float] = field(default_factory=list)  # per request: how long it waited unseen
    tiled: int = 0  # consecutive busy steps with no gap at all
    live_logs: int = 0
    # logs whose Header says how their loop ran (``extra.overlap``): overlapped, sequential
    overlapped_logs: int = 0
    sequential_logs: int = 0

    @property
    def overlap(self) -> bool:
        """Whether the logs' steps overlap: as their headers say the live loop ran them, or (logs
        written before headers said so) by whether their busy steps tile."""
        if self.overlapped_logs or self.sequential_logs:
            return self.overlapped_logs > self.sequential_logs
        return bool(self.busy_gaps) and self.tiled >= OVERLAP_SHARE * len(self.busy_gaps)

    def extend(self, other: HostData) -> None:
        for name in ("busy_gaps", "busy_spans", "busy_drafts", "wakes", "intake_lags"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("tiled", "live_logs", "overlapped_logs", "sequential_logs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @classmethod
    def from_log(cls, log: LogPath | LoggedRun) -> HostData:
        """A profile sweep's log (Header ``extra.profile``) gives busy gaps only, and none a request
        was added in: its requests are added by the sweep (a synthetic prompt made each time), not
        by a front door."""
        run = log if isinstance(log, LoggedRun) else LoggedRun.read(log)
        extra = run.header.extra
        profile = "profile" in extra
        data = cls(live_logs=0 if profile else 1)
        if isinstance(extra.get("overlap"), bool):
            data.overlapped_logs, data.sequential_logs = int(extra["overlap"]), int(not extra["overlap"])
        steps: list[tuple[float, float, int, int, int]] = []  # start, end, spans, drafts, requests ended before it
        arrivals: list[float] = []
        ended = 0
        for ev in run.events:
            if isinstance(ev, Step):
                steps.append((ev.start, ev.end, len(ev.spans), sum(map(len, ev.drafts)), ended))
            elif isinstance(ev, Arrived):
                arrivals.append(ev.time)
                if not profile and steps:
                    # it arrived before the last step was scheduled, yet the engine took it in only
                    # after that step: it waited unseen at least this long
                    data.intake_lags.append(max(steps[-1][0] - ev.time, 0.0))
                elif not profile:
                    data.intake_lags.append(0.0)
            elif isinstance(ev, Finished | Aborted):
                ended += 1
        order = np.sort(np.asarray(arrivals))
        prev_end, prev_spans, prev_drafts = None, 0, 0
        for start, end, spans, drafts, ended_before in steps:
            added = False  # (a sweep's request added in the gap: the sweep's time, not the engine's)
            if prev_end is None:
                ready = float(order[0]) if len(order) else start
                idle = True
            else:
                arrived = int(np.searchsorted(order, prev_end, side="right"))
                idle = arrived - ended_before <= 0 and arrived < len(order)
                ready = float(order[arrived]) if idle else prev_end
                added = profile and np.searchsorted(order, start, "right") > np.searchsorted(order, prev_end, "left")
            gap = start - ready
            if idle:
                if not profile:
                    data.wakes.append(max(gap, 0.0))
            elif not added:
                data.busy_gaps.append(max(gap, 0.0))
                data.busy_spans.append(prev_spans)
                data.busy_drafts.append(prev_drafts)
                data.tiled += gap == 0.0
            prev_end, prev_spans, prev_drafts = end, spans, drafts
        return data


def fit_host_timing(logs: Sequence[LogPath | LoggedRun]) -> HostTiming:
    """Host timing from the gaps of ``logs`` (least squares for busy gaps; medians for wake and intake)."""
    data = HostData()
    runs = read_runs(logs)
    for run in runs:
        data.extend(HostData.from_log(run))
    fitted: dict[str, Any] = {"logs": [r.path for r in runs], "busy_gaps": len(data.busy_gaps),
                              "wakes": len(data.wakes), "requests": len(data.intake_lags)}
    parts: dict[str, Any] = {}
    if data.busy_gaps:
        y = np.asarray(data.busy_gaps)
        parts["overlap"] = data.overlap
        drafts = np.asarray(data.busy_drafts, dtype=float)
        if drafts.any():  # the part of a gap its verified drafts explain, then the rest as without them
            X = np.column_stack([np.ones_like(y), np.asarray(data.busy_spans, dtype=float), drafts])
            parts["gap_per_draft"] = max(float(np.linalg.lstsq(X, y, rcond=None)[0][2]), 0.0)
            y = y - parts["gap_per_draft"] * drafts
        X = np.column_stack([np.ones_like(y), np.asarray(data.busy_spans, dtype=float)])
        coef = np.linalg.lstsq(X, y, rcond=None)[0]
        if coef[1] < 0:  # a gap does not shrink with the batch: the mean alone
            coef = np.array([y.mean(), 0.0])
        if coef[0] < 0:
            coef = np.array([0.0, float(y @ X[:, 1] / max(X[:, 1] @ X[:, 1], 1e-12))])
        parts["gap_const"], parts["gap_per_seq"] = float(coef[0]), float(coef[1])
        fitted["busy_gap_mean_s"] = float(y.mean())
    intake = float(np.median(data.intake_lags)) if data.intake_lags else 0.0
    if data.intake_lags:
        parts["intake_delay"] = intake
    if data.wakes:
        parts["wake"] = max(float(np.median(data.wakes)) - intake, 0.0)
    return HostTiming(**parts, fitted_from=fitted)


def log_overlaps(path: LogPath) -> bool:
    """Whether the log's steps overlap (an async engine's log: its header says so, or its busy steps tile)."""
    return HostData.from_log(path).overlap
