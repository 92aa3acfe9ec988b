"""Step-time models: how long an engine step takes, from the step's shape alone.

A step's shape is its spans, so any log's ``Step`` events are training data; the features are in
simulator/cost/features.py. A model file written before a feature existed has no coefficient for it:
that coefficient is 0 (``MISSING_COEFFICIENT``), so such a file loads and predicts exactly what it
did before.

``LinearCostModel`` is a non-negative least-squares fit over the features (weighting relative —
short and long steps count alike — or absolute, which keeps the total time);
``TreeCostModel`` (simulator/cost/tree_model.py) adds boosted trees or a forest; which one a fit keeps
is chosen by held-out error (simulator/fitting/fit.py). Either may carry host timing and the ranges it
was fitted on (simulator/cost/model_base.py). ``RecordedCostModel`` returns a log's own step durations
(for trace-vs-live tests and zero-error timing replay). ``load_cost_model`` reads any of them.
"""

from __future__ import annotations

import json
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.cost.engine_timing import EngineTiming
from simulator.cost.features import (
    EXT_FEATURES,
    FEATURE_DOC,
    FEATURES,
    PADDED,
    current_names,
    ext_features,
    step_features,
)
from simulator.cost.model_base import (
    FORMAT,
    CostModel,
    CostModelError,
    TimedModel,
    mape,
    prediction_errors,
    read_model_doc,
    total_error,
)
from simulator.cost.nnls import nnls
from simulator.cost.padding_cost import padding_cost
from simulator.cost.tree_model import TreeCostModel
from traces.decode_splits import DecodeSplits
from traces.events import Header, Span, Step
from traces.log import read_log
from traces.speculation import verifying
from traces.step_padding import StepPadding

__all__ = ["EXT_FEATURES", "FEATURES", "FEATURE_DOC", "FORMAT", "MISSING_COEFFICIENT", "CostModel", "CostModelError",
           "LinearCostModel", "RecordedCostModel", "StepData", "TreeCostModel", "load_cost_model", "mape",
           "shipped_cost_models", "step_features", "total_error"]

# The coefficient of a feature a cost-model file doesn't list (written before the feature existed).
MISSING_COEFFICIENT = 0.0


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

    @property
    def ext(self) -> np.ndarray:
        """[steps, len(EXT_FEATURES)]"""
        if self.extra is None:
            raise CostModelError("these steps carry no extended features")
        return np.hstack([self.features, self.extra])

    @classmethod
    def from_logs(cls, paths: Sequence[str | Path]) -> StepData:
        """Each log's steps, their decode kernel split as its header says."""
        rows: list[list[float]] = []
        ys: list[float] = []
        idx: list[int] = []
        next_extra: list[int] = []
        policies: dict[DecodeSplits | None, str] = {}
        first_padding: StepPadding | None = None
        for i, path in enumerate(paths):
            splits = padding = None
            prev_end = None
            for ev in read_log(path):
                if isinstance(ev, Step):
                    rows.append(ext_features(ev.spans, splits, padding, verifying(ev)))
                    ys.append(ev.end - ev.start)
                    idx.append(i)
                    if prev_end == ev.start:
                        next_extra[-1] = int(sum(s.num_tokens for s in ev.spans)) - len(ev.spans)
                    next_extra.append(0)
                    prev_end = ev.end
                elif isinstance(ev, Header):
                    splits = DecodeSplits.from_header_extra(ev.extra)
                    policies.setdefault(splits, str(path))
                    padding = StepPadding.from_header(ev.config, ev.extra)
                    first_padding = first_padding or padding
        if not rows:
            raise CostModelError(f"no Step events in {', '.join(map(str, paths))}")
        X = np.asarray(rows, dtype=np.float64)
        n = len(FEATURES)
        return cls(X[:, :n], np.asarray(ys), [str(p) for p in paths], np.asarray(idx), X[:, n:],
                   one_policy(policies), np.asarray(next_extra), first_padding)

    def subset(self, mask: np.ndarray) -> StepData:
        return StepData(self.features[mask], self.durations[mask], self.logs,
                        None if self.log_index is None else self.log_index[mask],
                        None if self.extra is None else self.extra[mask], self.decode_splits,
                        None if self.next_extra is None else self.next_extra[mask], self.step_padding)

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
        return cls(np.vstack([p.features for p in parts]), np.concatenate([p.durations for p in parts]), logs,
                   np.concatenate(idx), extra, one_policy({p.decode_splits: p.logs[0] for p in parts if p.logs}), nxt,
                   padding)

    def split(self, holdout_every: int, block: int = 1) -> tuple[StepData, StepData]:
        """Deterministic split: every ``holdout_every``-th block of ``block`` consecutive steps held
        out. Neighbouring steps of a run are near copies of each other (the same batch one token
        on), so single held-out steps flatter a model that memorizes; blocks test it on stretches
        it has not seen. The block shrinks so that at least 4 blocks of each kind remain."""
        n = len(self.durations)
        block = max(1, min(block, n // (4 * holdout_every)))
        mask = (np.arange(n) // block) % holdout_every == holdout_every - 1
        return self.subset(~mask), self.subset(mask)


class LinearCostModel(TimedModel):
    """``step_time = Σ coefficient · feature``; coefficients in seconds per unit, all >= 0.

    A feature missing from ``coefficients`` gets ``MISSING_COEFFICIENT`` (0): that is how a file
    written before the feature existed loads. Such features are listed in ``defaulted_features``.
    """

    def __init__(self, coefficients: dict[str, float], meta: dict[str, Any] | None = None) -> None:
        unknown = set(coefficients) - set(FEATURES)
        if unknown:
            raise CostModelError(f"unknown cost-model features {sorted(unknown)}; known: {list(FEATURES)}")
        self.defaulted_features = [f for f in FEATURES if f not in coefficients]
        self.coefficients = {f: float(coefficients.get(f, MISSING_COEFFICIENT)) for f in FEATURES}
        bad = [f for f, c in self.coefficients.items() if not c >= 0]
        if bad:
            raise CostModelError(f"cost-model coefficients must be >= 0: {bad}")
        self.meta = dict(meta or {})
        self._derive()

    def _derive(self) -> None:
        """What step_time reads of the coefficients (again after they change): one tuple, unpacked
        once a step (cheaper than eight attribute reads)."""
        self._terms = tuple(self.coefficients[f] for f in FEATURES)

    def scale(self, factor: float) -> None:
        """Multiply every step time the model predicts by ``factor`` (in place)."""
        self.coefficients = {f: c * factor for f, c in self.coefficients.items()}
        self._derive()

    def step_time(self, step: int, spans: Sequence[Span], verifying: Container[int] = ()) -> float:
        # inlined step_features: this runs once per simulated step (longest_program: mx, split below)
        pt = pa = ds = dc = mx = rows = 0  # rows: verify spans' decode rows
        for s in spans:
            n = s.num_tokens
            if n == 1:
                ds += 1
                dc += s.start
                if s.start >= mx:
                    mx = s.start + 1
            elif s.request_id in verifying:  # 1 + d decode rows, the context read once (dc + ds below)
                ds += n
                rows += n
                dc += s.start
                if s.start + n > mx:
                    mx = s.start + n
            else:
                pt += n
                pa += n * s.start + n * (n + 1) // 2
        if not pt and not rows:  # (a step with verify rows has fewer sequences than decode rows)
            return self.decode_time(ds, dc + ds, mx)
        c, c_pt, c_pa, c_ds, c_dc, c_ns, c_ps, c_mx, c_pad = self._terms
        t = c + c_pt * pt + c_pa * pa + c_ds * ds + c_dc * (dc + ds) + c_ns * len(spans) + (c_ps if pt else 0.0)
        if mx and c_mx:  # (a model without the coefficient adds nothing, not even a 0.0)
            splits = self.decode_splits
            t += c_mx * (mx if splits is None else splits.longest_program(mx, ds))
        if c_pad and pt and self.padding is not None:
            t += c_pad * self.padding.padding(pt + ds)
        return t if self._overlap is None else self._overlapped(t, len(spans))

    def decode_time(self, n: int, context: int, longest: int) -> float:
        """``step_time`` of a decode-only step of ``n`` spans, ``context`` = Σ (start + 1) and
        ``longest`` = the largest start + 1 (``step_time`` of such a step; the simulator's runs of
        decode steps price theirs without spans)."""
        c, c_pt, c_pa, c_ds, c_dc, c_ns, c_ps, c_mx, _ = self._terms
        t = c + c_pt * 0 + c_pa * 0 + c_ds * n + c_dc * context + c_ns * n  # (the terms in step_time's order)
        if longest and c_mx:
            splits = self.decode_splits
            t += c_mx * (longest if splits is None else splits.longest_program(longest, n))
        return t if self._overlap is None else self._overlapped(t, n)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return features @ np.array([self.coefficients[f] for f in FEATURES])

    # --- fitting -----------------------------------------------------------------------------------

    @classmethod
    def fit(cls, data: StepData, *, weighting: str = "relative", meta: dict[str, Any] | None = None
            ) -> LinearCostModel:
        """Non-negative least squares; ``relative`` weighting minimizes squared relative error."""
        X, y = data.features, data.durations
        keep = y > 0
        # the padded tokens' cost comes from within logs (simulator/cost/padding_cost.py); the rest is fitted around it
        c_pad = padding_cost(X, y, data.log_index)
        X, y = X[keep].copy(), y[keep]
        rest = y - c_pad * X[:, PADDED]
        X[:, PADDED] = 0
        if len(y) == 0:
            raise CostModelError("no steps with a positive duration to fit")
        if weighting == "relative":
            X, b = X / y[:, None], rest / y
        elif weighting == "absolute":
            b = rest
        else:
            raise CostModelError(f"weighting must be 'relative' or 'absolute', got {weighting!r}")
        norms = np.linalg.norm(X, axis=0)
        present = norms > 0  # a feature never seen in training (e.g. no prefill) is not fitted
        coef = np.zeros(len(FEATURES))
        coef[present] = nnls(X[:, present] / norms[present], b) / norms[present]
        coef[PADDED], present[PADDED] = c_pad, c_pad > 0
        meta = dict(meta or {})
        meta["unfitted_features"] = [f for f, p in zip(FEATURES, present) if not p]
        model = cls(dict(zip(FEATURES, coef.tolist())), meta)
        model.meta["training"] = {"logs": data.logs, "steps": int(len(y)),
                                  "mape": mape(model.predict(data.features[keep]), y)}
        return model

    def predict_steps(self, data: StepData) -> np.ndarray:
        """The step times of ``data``'s rows."""
        return self.predict(data.features)

    def evaluate(self, data: StepData) -> dict[str, Any]:
        """Per-step MAPE overall and per log."""
        return prediction_errors(self.predict_steps(data), data)

    # --- persistence -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": 1, "kind": "linear", **self.meta,
                "features": FEATURE_DOC, "coefficients": self.coefficients, **self.timed_parts()}

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> LinearCostModel:
        """A model from JSON; a feature the file has no coefficient for costs ``MISSING_COEFFICIENT``."""
        doc = read_model_doc(path)
        if doc.get("kind") != "linear":
            raise CostModelError(f"{path}: not a minivllm linear cost model (format {FORMAT!r}, kind 'linear')")
        return cls.from_doc(doc, path)

    @classmethod
    def from_doc(cls, doc: dict[str, Any], path: str | Path = "") -> LinearCostModel:
        coefficients = doc.get("coefficients")
        if not isinstance(coefficients, dict):
            raise CostModelError(f"{path}: field 'coefficients' must be an object")
        meta = {k: v for k, v in doc.items()
                if k not in ("format", "version", "kind", "features", "coefficients", "host", "ranges",
                             "decode_splits", "step_padding")}
        try:
            model = cls(current_names(coefficients), meta)
        except CostModelError as e:
            raise CostModelError(f"{path}: {e}") from None
        model.load_timed_parts(doc, path)
        return model


class RecordedCostModel(CostModel):
    """The step durations a log recorded, keyed by step index — and the engine's time between steps.

    ``gap_before(k)`` is what the recording spent between being ready for step k (the previous
    commit, or the arrival that woke an idle engine) and scheduling it: Python overhead, request
    intake. The simulator waits it out before scheduling, so arrivals the live engine took in
    during that time land in the same step: re-simulation reproduces the live decisions.
    """

    def __init__(self, durations: dict[int, float], source: str = "", gaps: dict[int, float] | None = None
                 ) -> None:
        self.durations = durations
        self.gaps = gaps or {}
        self.source = source

    @classmethod
    def from_log(cls, path: str | Path) -> RecordedCostModel:
        from traces.events import Aborted, Arrived, Finished

        steps: list[tuple[int, float, float, int]] = []  # step, start, end, finishes logged before it
        arrival: dict[int, float] = {}
        finished: list[int] = []
        aborted: set[int] = set()
        for ev in read_log(path):
            if isinstance(ev, Step):
                steps.append((ev.step, ev.start, ev.end, len(finished)))
            elif isinstance(ev, Arrived):
                arrival[ev.request_id] = ev.time
            elif isinstance(ev, Finished):
                finished.append(ev.request_id)
            elif isinstance(ev, Aborted):
                aborted.add(ev.request_id)
        # aborted requests are not part of a re-simulated workload: leave them out of the counts
        arrivals = np.sort([t for rid, t in arrival.items() if rid not in aborted])
        done = np.cumsum([0] + [rid not in aborted for rid in finished])
        durations: dict[int, float] = {}
        gaps: dict[int, float] = {}
        prev_end = None
        for step, start, end, n_finished in steps:
            if prev_end is None:
                ready = float(arrivals[0]) if len(arrivals) else start
            else:
                arrived = int(np.searchsorted(arrivals, prev_end, side="right"))
                idle = arrived - done[n_finished] <= 0 and arrived < len(arrivals)
                ready = float(arrivals[arrived]) if idle else prev_end  # idle: woken by the next arrival
            durations[step] = end - start
            if start > ready:
                gaps[step] = start - ready
            prev_end = end
        return cls(durations, str(path), gaps)

    def step_time(self, step: int, spans: Sequence[Span], verifying: Container[int] = ()) -> float:
        try:
            return self.durations[step]
        except KeyError:
            raise CostModelError(f"step {step} is not in the recorded log {self.source}: "
                                 "the run diverged from the recording") from None

    def gap_before(self, step: int) -> float:
        return self.gaps.get(step, 0.0)

    def timing(self, max_num_batched_tokens: int) -> EngineTiming:
        return EngineTiming(step_time=self.step_time, gap_before=self.gap_before)


def load_cost_model(spec: str | Path) -> CostModel:
    """A cost model from a JSON file, ``recorded:LOG``, or a name shipped in simulator/cost/cost_models."""
    spec = str(spec)
    if spec.startswith("recorded:"):
        return RecordedCostModel.from_log(spec.split(":", 1)[1])
    path = Path(spec)
    if not path.exists():
        shipped = Path(__file__).parent / "cost_models" / f"{spec.removesuffix('.json')}.json"
        if shipped.exists():
            path = shipped
        else:
            raise FileNotFoundError(f"{spec}: no such cost model (a JSON file, recorded:LOG, or one of "
                                    f"{', '.join(shipped_cost_models())})")
    doc = read_model_doc(path)
    kind = doc.get("kind")
    if kind == "linear":
        return LinearCostModel.from_doc(doc, path)
    if kind == "trees":
        return TreeCostModel.from_doc(doc, path)
    raise CostModelError(f"{path}: unknown cost-model kind {kind!r} (known: linear, trees)")


def shipped_cost_models() -> list[str]:
    return sorted(p.stem for p in (Path(__file__).parent / "cost_models").glob("*.json"))
