"""The steps of some logs as training data: each step's features and its recorded duration.

A step's shape is its spans (features: simulator/cost/features.py); each log's header says how its
decode kernel split long contexts and how its prefill steps were padded, and the features follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from simulator.cost.cost_model import CostModelError
from simulator.cost.features import FEATURES, ext_features
from simulator.cost.logged_run import LoggedRun, LogPath, read_runs
from traces.decode_splits import DecodeSplits
from traces.events import Header, Step
from traces.speculation import verifying
from traces.step_padding import StepPadding


def one_policy(policies: dict[DecodeSplits | None, str]) -> DecodeSplits | None:
    """The decode split policy of some logs (keyed to a log that ran it); logs of different
    kernels, models or devices are not steps of one model."""
    if len(policies) > 1:
        runs = "; ".join(f"{p} ({s.to_dict() if s else 'not split'})" for s, p in policies.items())
        raise CostModelError(f"these logs ran different decode kernels, fit them apart: {runs}")
    return next(iter(policies), None)


@dataclass
class StepData:
    """Features and recorded durations of the steps of some logs."""

    features: np.ndarray  # [steps, len(FEATURES)]
    durations: np.ndarray  # [steps]
    logs: list[str] = field(default_factory=list)
    log_index: np.ndarray | None = None  # [steps]: which log each row came from
    extra: np.ndarray | None = None  # [steps, len(EXTRA)]: the rest of EXT_FEATURES
    decode_splits: DecodeSplits | None = None  # the logs' decode kernel split policy (their headers)
    # per step, of its log's next step when that one starts as this one ends (an overlapped engine's
    # steps tile): its tokens beyond one per span (0: none, or a decode-only step; simulator/cost/launch.py)
    next_extra: np.ndarray | None = None
    step_padding: StepPadding | None = None  # the first padded log's (each log's steps padded as its header says)
    # per step, its time on the device (Step.device_time; NaN where the log has none)
    device: np.ndarray | None = None

    @property
    def device_timed(self) -> bool:
        """Every step carries its time on the device (a profile sweep on a GPU)."""
        return self.device is not None and len(self.device) > 0 and bool(np.isfinite(self.device).all())

    def on_device(self) -> StepData:
        """These steps with their times on the device as durations: what the step model learns when the
        host's view of a step (a launch of the next one holding it back) is logged apart."""
        return replace(self, durations=self.device)

    @property
    def ext(self) -> np.ndarray:
        """[steps, len(EXT_FEATURES)]"""
        if self.extra is None:
            raise CostModelError("these steps carry no extended features")
        return np.hstack([self.features, self.extra])

    @classmethod
    def from_logs(cls, logs: Sequence[LogPath | LoggedRun]) -> StepData:
        """Each log's steps, their decode kernel split as its header says."""
        rows: list[list[float]] = []
        ys: list[float] = []
        idx: list[int] = []
        next_extra: list[int] = []
        device: list[float] = []
        policies: dict[DecodeSplits | None, str] = {}
        first_padding: StepPadding | None = None
        runs = read_runs(logs)
        for i, run in enumerate(runs):
            splits = padding = None
            prev_end = None
            for ev in run.events:
                if isinstance(ev, Step):
                    rows.append(ext_features(ev.spans, splits, padding, verifying(ev)))
                    ys.append(ev.end - ev.start)
                    device.append(np.nan if ev.device_time is None else ev.device_time)
                    idx.append(i)
                    if prev_end == ev.start:
                        next_extra[-1] = ev.extra_tokens
                    next_extra.append(0)
                    prev_end = ev.end
                elif isinstance(ev, Header):
                    splits = DecodeSplits.from_header_extra(ev.extra)
                    policies.setdefault(splits, run.path)
                    padding = StepPadding.from_header(ev.config, ev.extra)
                    first_padding = first_padding or padding
        if not rows:
            raise CostModelError(f"no Step events in {', '.join(r.path for r in runs)}")
        X = np.asarray(rows, dtype=np.float64)
        n = len(FEATURES)
        return cls(X[:, :n], np.asarray(ys), [r.path for r in runs], np.asarray(idx), X[:, n:],
                   one_policy(policies), np.asarray(next_extra), first_padding, np.asarray(device))

    def subset(self, mask: np.ndarray) -> StepData:
        return StepData(self.features[mask], self.durations[mask], self.logs,
                        None if self.log_index is None else self.log_index[mask],
                        None if self.extra is None else self.extra[mask], self.decode_splits,
                        None if self.next_extra is None else self.next_extra[mask], self.step_padding,
                        None if self.device is None else self.device[mask])

    def weighted(self, weights: dict[int, int]) -> StepData:
        """These steps with log ``i``'s rows counted ``weights[i]`` times in all (repeated rows: an
        integer weight in every fit, the log's index kept)."""
        rows = [np.arange(len(self.durations))]
        for log, times in weights.items():
            rows += [np.flatnonzero(self.log_index == log)] * (times - 1)
        return self.subset(np.concatenate(rows))

    @classmethod
    def concat(cls, parts: Sequence[StepData]) -> StepData:
        """Steps of several sets (log indices renumbered after each other's logs)."""
        logs: list[str] = []
        idx = []
        for p in parts:
            base = len(logs)
            logs += p.logs
            idx.append((p.log_index if p.log_index is not None else np.zeros(len(p.durations), int)) + base)
        extra = None if any(p.extra is None for p in parts) else np.vstack([p.extra for p in parts])
        nxt = None if any(p.next_extra is None for p in parts) else np.concatenate([p.next_extra for p in parts])
        padding = next((p.step_padding for p in parts if p.step_padding is not None), None)
        device = None if any(p.device is None for p in parts) else np.concatenate([p.device for p in parts])
        return cls(np.vstack([p.features for p in parts]), np.concatenate([p.durations for p in parts]), logs,
                   np.concatenate(idx), extra, one_policy({p.decode_splits: p.logs[0] for p in parts if p.logs}), nxt,
                   padding, device)

    def split(self, holdout_every: int, block: int = 1) -> tuple[StepData, StepData]:
        """Deterministic split: every ``holdout_every``-th block of ``block`` consecutive steps held
        out. Neighbouring steps of a run are near copies of each other (the same batch one token
        on), so single held-out steps flatter a model that memorizes; blocks test it on stretches
        it has not seen. The block shrinks so that at least 4 blocks of each kind remain."""
        n = len(self.durations)
        block = max(1, min(block, n // (4 * holdout_every)))
        mask = (np.arange(n) // block) % holdout_every == holdout_every - 1
        return self.subset(~mask), self.subset(mask)
