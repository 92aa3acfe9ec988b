"""What every fitted step-time model shares: the file format and the parts besides the step model —
host timing (simulator/cost/host_timing.py), the ranges it was fitted on (simulator/cost/ranges.py),
the decode kernel's splits and the prefill steps' padding.

The simulator asks a model for its ``timing`` (simulator/cost/engine_timing.py): ``step_time(step,
spans, verifying)`` and, where the model has them, ``host_gap(previous_spans, previous_drafts)``
(engine time before a step; None after idle), ``intake_delay`` (seconds from a request's arrival
stamp until the engine sees it), planning ahead with a launch time, and runs of decode steps priced
at once.

A fitted model is immutable: every change (``with_host``, ``scaled``, ...) returns a new model, so
one model can be shared by simulations, sensitivity runs and a calibration without copies.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.cost.accuracy import prediction_errors
from simulator.cost.cost_model import CostModel, CostModelError
from simulator.cost.engine_timing import EngineTiming
from simulator.cost.host_timing import HostTiming
from simulator.cost.ranges import FeatureRanges
from simulator.cost.shared_device import SharedDevice
from traces.decode_splits import DecodeSplits
from traces.step_padding import StepPadding

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self  # (typing's from Python 3.11)

    from simulator.cost.step_data import StepData

FORMAT = "minivllm-cost-model"
# the parts a model file keeps beside its step model (``timed_parts``): never metadata
TIMED_PARTS = ("host", "ranges", "decode_splits", "step_padding", "shared_device")


def read_model_doc(path: str | Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise CostModelError(f"{path}:{e.lineno}: not JSON: {e.msg}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CostModelError(f"{path}: not a minivllm cost model (format {FORMAT!r})")
    return doc


class TimedModel(CostModel):
    """A step model with host timing, feature ranges, decode splits and padding beside it (all
    optional: a file without them simulates as before, steps back to back, and warns about nothing).
    Subclasses keep ``meta`` (identity, fit report) and recompute what ``step_time`` caches in
    ``_derive``."""

    meta: dict[str, Any]
    host: HostTiming | None = None
    ranges: FeatureRanges | None = None
    decode_splits: DecodeSplits | None = None  # the decode kernel's split policy (longest_program)
    # the padding of the fitted logs' prefill steps (None: not padded) and the one in effect: a
    # simulation pads to its own step budget's captured counts (``with_step_budget``)
    step_padding: StepPadding | None = None
    padding: StepPadding | None = None
    intake_delay: float = 0.0
    shared_device: SharedDevice | None = None  # a co-located profile's fit (None: sharing costs no more)
    _overlap: tuple[float, float, float] | None = None  # host const, host per span, launch

    def _derive(self) -> None:
        """Recompute what ``step_time`` caches of the model's parts (a new model's caches are its own)."""

    def _evolve(self, **changes: Any) -> Self:
        """A copy with these attributes changed; this model stays as it was."""
        new = copy.copy(self)
        new.meta = dict(self.meta)
        for name, value in changes.items():
            setattr(new, name, value)
        new._derive()
        return new

    @staticmethod
    def _host_parts(host: HostTiming | None) -> dict[str, Any]:
        overlap = (host.gap_const, host.gap_per_seq, host.launch) if host is not None and host.overlap else None
        return {"host": host, "intake_delay": host.intake_delay if host is not None else 0.0, "_overlap": overlap}

    def predict_steps(self, data: StepData) -> np.ndarray:
        """The step times of ``data``'s rows."""
        raise NotImplementedError

    def evaluate(self, data: StepData) -> dict[str, Any]:
        """Per-step MAPE and total-time error, overall and per log."""
        return prediction_errors(self.predict_steps(data), data)

    def scaled(self, factor: float) -> Self:
        """This model with every step time it predicts multiplied by ``factor``."""
        raise NotImplementedError

    def with_host(self, host: HostTiming | None) -> Self:
        """This model with that host timing (its intake delay the host's)."""
        return self._evolve(**self._host_parts(host))

    def with_intake_delay(self, delay: float) -> Self:
        """This model with the front door's delay set apart from its host timing (a fit trying delays)."""
        return self._evolve(intake_delay=delay)

    def with_ranges(self, ranges: FeatureRanges | None) -> Self:
        return self._evolve(ranges=ranges)

    def with_decode_splits(self, splits: DecodeSplits | None) -> Self:
        return self._evolve(decode_splits=splits)

    def with_step_padding(self, padding: StepPadding | None) -> Self:
        """This model fitted on steps padded so (the padding in effect unless a view for another
        budget is taken: ``with_step_budget``)."""
        return self._evolve(step_padding=padding, padding=padding)

    def with_shared_device(self, shared: SharedDevice | None) -> Self:
        """This model with what sharing a device costs a step (a co-located profile's fit)."""
        return self._evolve(shared_device=shared)

    def with_meta(self, **entries: Any) -> Self:
        """This model with these metadata entries added or replaced (an existing key keeps its place)."""
        return self._evolve(meta={**self.meta, **entries})

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
                            launch_time=view.launch_time, decode_durations=view.decode_durations,
                            shared_slowdown=1.0 if view.shared_device is None else view.shared_device.slowdown)

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
        if self.shared_device is not None:
            out["shared_device"] = self.shared_device.to_dict()
        return out

    def with_timed_parts(self, doc: dict[str, Any], path: str | Path) -> Self:
        """This model with the parts a model file keeps beside its step model."""
        try:
            host = HostTiming.from_dict(doc["host"]) if isinstance(doc.get("host"), dict) else None
            ranges = FeatureRanges.from_dict(doc["ranges"]) if isinstance(doc.get("ranges"), dict) else None
            splits = DecodeSplits.from_dict(doc.get("decode_splits"))
            padding = doc.get("step_padding")
            padding = StepPadding(int(padding["max_tokens"])) if padding else None
            shared = doc.get("shared_device")
            shared = SharedDevice.from_dict(shared) if shared is not None else None
        except (TypeError, ValueError, KeyError, IndexError) as e:
            raise CostModelError(f"{path}: host, ranges, decode_splits, step_padding or shared_device: {e}") from None
        return self._evolve(**self._host_parts(host), ranges=ranges, decode_splits=splits, step_padding=padding,
                            padding=padding, shared_device=shared)

    def with_step_budget(self, max_tokens: int) -> Self:
        """This model as an engine of that step budget runs: a model fitted on padded steps pads
        prefill steps to the budget's captured counts. A shallow copy when that changes the padding
        (the model itself unchanged, so simulations of different budgets can share it), else self."""
        if self.step_padding is None or (self.padding is not None and self.padding.max_tokens == max_tokens):
            return self
        view = copy.copy(self)
        view.padding = StepPadding(max_tokens)
        return view


def for_step_budget(model: CostModel, max_tokens: int) -> CostModel:
    """``model`` for an engine of this step budget (``with_step_budget``; itself without one)."""
    view = getattr(model, "with_step_budget", None)
    return model if view is None else view(max_tokens)
