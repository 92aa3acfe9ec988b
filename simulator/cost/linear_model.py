"""The linear step-time model: ``step_time = Σ coefficient · feature`` over the features of
simulator/cost/features.py, fitted by non-negative least squares (weighting relative — short and
long steps count alike — or absolute, which keeps the total time).

A model file written before a feature existed has no coefficient for it: that coefficient is 0
(``MISSING_COEFFICIENT``), so such a file loads and predicts exactly what it did before.
"""

from __future__ import annotations

import json
from collections.abc import Container, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.cost.accuracy import mape
from simulator.cost.cost_model import CostModelError
from simulator.cost.features import FEATURE_DOC, FEATURES, PADDED, current_names
from simulator.cost.model_base import FORMAT, TIMED_PARTS, TimedModel, read_model_doc
from simulator.cost.nnls import nnls
from simulator.cost.padding_cost import padding_cost
from simulator.cost.step_data import StepData
from traces.events import Span

if TYPE_CHECKING:
    from typing_extensions import Self

# The coefficient of a feature a cost-model file doesn't list (written before the feature existed).
MISSING_COEFFICIENT = 0.0


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
        """What step_time reads of the coefficients: one tuple, unpacked once a step (cheaper than
        eight attribute reads)."""
        self._terms = tuple(self.coefficients[f] for f in FEATURES)

    def scaled(self, factor: float) -> Self:
        """This model with every step time it predicts multiplied by ``factor``."""
        return self._evolve(coefficients={f: c * factor for f, c in self.coefficients.items()})

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
        return model.with_meta(training={"logs": data.logs, "steps": int(len(y)),
                                         "mape": mape(model.predict(data.features[keep]), y)})

    def predict_steps(self, data: StepData) -> np.ndarray:
        """The step times of ``data``'s rows."""
        return self.predict(data.features)


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
                if k not in ("format", "version", "kind", "features", "coefficients", *TIMED_PARTS)}
        try:
            model = cls(current_names(coefficients), meta)
        except CostModelError as e:
            raise CostModelError(f"{path}: {e}") from None
        return model.with_timed_parts(doc, path)
