"""What every fitted step-time model shares: the file format, the error, the per-step MAPE, and
the parts besides the step model — host timing (simulator/cost/host_timing.py) and the ranges it was
fitted on (simulator/cost/ranges.py).

The simulator asks a model for its ``timing`` (simulator/cost/engine_timing.py): ``step_time(step,
spans, verifying)`` and, where the model has them, ``host_gap(previous_spans, previous_drafts)``
(engine time before a step; None after idle), ``intake_delay`` (seconds from a request's arrival
stamp until the engine sees it), planning ahead with a launch time, and runs of decode steps priced
at once.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Container
from pathlib import Path
from typing import Any

import numpy as np

from simulator.cost.engine_timing import EngineTiming
from simulator.cost.host_timing import HostTiming
from simulator.cost.ranges import FeatureRanges
from traces.decode_splits import DecodeSplits
from traces.events import Span
from traces.step_padding import StepPadding

FORMAT = "minivllm-cost-model"


class CostModelError(ValueError):
    """A cost model file is malformed or can't serve the step asked for."""


class CostModel:
    """A step-time model: ``step_time`` prices a step from its spans; ``timing`` is everything a
    simulation asks of the model (simulator/cost/engine_timing.py), for an engine of a step budget. A
    model that times only steps need define ``step_time`` alone."""

    def step_time(self, step: int, spans: list[Span], verifying: Container[int] = ()) -> float:
        """Seconds that step ``step`` with these spans takes; the spans of the requests in
        ``verifying`` verify speculative drafts (simulator/cost/features.py)."""
        raise NotImplementedError

    def timing(self, max_num_batched_tokens: int) -> EngineTiming:
        return EngineTiming(step_time=self.step_time)


def mape(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute percentage error over steps with a positive recorded duration (in %)."""
    ok = actual > 0
    if not ok.any():
        return float("nan")
    return float(np.mean(np.abs(predicted[ok] - actual[ok]) / actual[ok]) * 100)


def total_error(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Signed error of the summed step time, in % of the recorded sum."""
    total = float(actual.sum())
    return float((predicted.sum() - total) / total * 100) if total > 0 else float("nan")


def prediction_errors(pred: np.ndarray, data: Any) -> dict[str, Any]:
    """Per-step MAPE and total-time error of ``pred`` against a StepData's durations, overall and per log."""
    out: dict[str, Any] = {"logs": data.logs, "steps": int(len(data.durations)),
                           "mape": mape(pred, data.durations), "total_error": total_error(pred, data.durations)}
    if data.log_index is not None and len(data.logs) > 1:
        out["per_log"] = {log: mape(pred[data.log_index == i], data.durations[data.log_index == i])
                          for i, log in enumerate(data.logs)}
    return out


def read_model_doc(path: str | Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise CostModelError(f"{path}:{e.lineno}: not JSON: {e.msg}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CostModelError(f"{path}: not a minivllm cost model (format {FORMAT!r})")
    return doc


class TimedModel(CostModel):
    """Host timing and feature ranges, carried beside a step model (both optional: a file without
    them simulates as before, steps back to back, and warns about nothing)."""

    host: HostTiming | None = None
    ranges: FeatureRanges | None = None
    decode_splits: DecodeSplits | None = None  # the decode kernel's split policy (longest_program)
    # the padding of the fitted logs' prefill steps (None: not padded) and the one in effect: a
    # simulation pads to its own step budget's captured counts (``with_step_budget``)
    step_padding: StepPadding | None = None
    padding: StepPadding | None = None
    intake_delay: float = 0.0
    _overlap: tuple[float, float, float] | None = None  # host const, host per span, launch

    def set_host(self, host: HostTiming | None) -> None:
        self.host = host
        self.intake_delay = host.intake_delay if host is not None else 0.0
        self._overlap = (host.gap_const, host.gap_per_seq, host.launch) if host is not None and host.overlap else None

    def host_gap(self, previous_spans: int | None, previous_drafts: int = 0) -> float:
        return 0.0 if self.host is None else self.host.gap(previous_spans, previous_drafts)

    @property
    def launch_time(self):
        """``f(extra_tokens) -> seconds``: the host time to plan and launch a step that carries
        prefill, which the overlapped engine spends while the step before runs (simulator/cost/launch.py);
        None when the model has none (steps then end when their device work does)."""
        host = self.host
        if host is None or not host.overlap or not (host.eager_launch or host.eager_launch_per_token):
            return None
        return host.eager_launch_time

    @property
    def plans_ahead(self) -> bool:
        """The engine plans step k+1 when step k starts (async scheduling): an arrival during step k
        joins step k+2 at the earliest."""
        return self._overlap is not None

    def timing(self, max_num_batched_tokens: int) -> EngineTiming:
        """This model as a simulation of that step budget runs it: its padding view
        (``with_step_budget``), its host timing where it has some, its runs of decode steps."""
        view = self.with_step_budget(max_num_batched_tokens)
        return EngineTiming(step_time=view.step_time, host_gap=view.host_gap if view.host is not None else None,
                            intake_delay=view.intake_delay,
                            intake_service=view.host.intake_service if view.host is not None else 0.0,
                            intake_per_token=view.host.intake_per_token if view.host is not None else 0.0,
                            plans_ahead=view.plans_ahead,
                            launch_time=view.launch_time, decode_durations=view.decode_durations)

    def decode_durations(self, n: int, context: int, longest: int, end: float, count: int,
                         due: float) -> list[float]:
        """The simulator's run of decode steps (simulator/sim.py ``_plain_run``): the durations of up
        to ``count`` decode-only steps back to back from ``end``, step i of ``n`` spans, context sum
        ``context + n·i`` and longest context ``longest + i`` (``decode_time``'s arguments), stopping
        before the first one that would end at or after ``due``."""
        decode_time = self.decode_time  # type: ignore[attr-defined]
        out: list[float] = []
        for i in range(count):
            t = decode_time(n, context + n * i, longest + i)
            end += t
            if end >= due:
                break
            out.append(t)
        return out

    def _overlapped(self, device: float, spans: int) -> float:
        """With overlapping steps a step costs max(host, device) + launch."""
        c, per, launch = self._overlap  # type: ignore[misc]
        return max(device, c + per * spans) + launch

    def timed_parts(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.host is not None:
            out["host"] = self.host.to_dict()
        if self.ranges is not None:
            out["ranges"] = self.ranges.to_dict()
        if self.decode_splits is not None:
            out["decode_splits"] = self.decode_splits.to_dict()
        if self.step_padding is not None:
            out["step_padding"] = {"max_tokens": self.step_padding.max_tokens}
        return out

    def load_timed_parts(self, doc: dict[str, Any], path: str | Path) -> None:
        try:
            self.set_host(HostTiming.from_dict(doc["host"]) if isinstance(doc.get("host"), dict) else None)
            self.ranges = FeatureRanges.from_dict(doc["ranges"]) if isinstance(doc.get("ranges"), dict) else None
            self.set_decode_splits(DecodeSplits.from_dict(doc.get("decode_splits")))
            padding = doc.get("step_padding")
            self.set_step_padding(StepPadding(int(padding["max_tokens"])) if padding else None)
        except (TypeError, ValueError, KeyError, IndexError) as e:
            raise CostModelError(f"{path}: host, ranges, decode_splits or step_padding: {e}") from None

    def set_decode_splits(self, splits: DecodeSplits | None) -> None:
        self.decode_splits = splits

    def set_step_padding(self, padding: StepPadding | None) -> None:
        """The fitted steps' padding (in effect unless a view for another budget is taken)."""
        self.step_padding = self.padding = padding

    def with_step_budget(self, max_tokens: int) -> TimedModel:
        """This model as an engine of that step budget runs: a model fitted on padded steps pads
        prefill steps to the budget's captured counts. A shallow copy when that changes the padding
        (the model itself unchanged, so simulations of different budgets can share it), else self."""
        if self.step_padding is None or (self.padding is not None and self.padding.max_tokens == max_tokens):
            return self
        view = copy.copy(self)
        view.padding = StepPadding(max_tokens)
        return view


def for_step_budget(model: Any, max_tokens: int) -> Any:
    """``model`` for an engine of this step budget (``with_step_budget``; itself without one)."""
    view = getattr(model, "with_step_budget", None)
    return model if view is None else view(max_tokens)
