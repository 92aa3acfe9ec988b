"""A non-linear step-time model: a linear base plus a tree ensemble over the extended features.

``step_time = Σ coefficient · feature + ensemble(ext_features)``. With a zero base the trees
model the duration alone (as Vidur's random forests do); with a least-squares base they model its
residual, which keeps the linear part's extrapolation beyond the fitted shapes (trees are flat
there) while the trees pick up what a line cannot: GEMMs padded to 16 rows on the CPU, the jump
from a CUDA-graph decode step to an eager mixed one, a kernel's switch of tile size.

Saved as JSON (``kind: "trees"``): the coefficients, the trees as arrays (simulator/trees.py), and
the parts every fitted model has (model_base.TimedModel). No pickle.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from operator import mul
from pathlib import Path
from typing import Any

import numpy as np

from simulator.features import EXT_FEATURES, FEATURE_DOC, FEATURES, ext_features
from simulator.model_base import FORMAT, CostModelError, TimedModel, prediction_errors
from simulator.trees import TreeEnsemble
from traces.events import Span

_N = len(FEATURES)
_DECODES, _CONTEXT, _PREFILLS = (EXT_FEATURES.index(f) for f in ("decode_seqs", "decode_context", "prefill_seqs"))


class TreeCostModel(TimedModel):
    def __init__(self, coefficients: dict[str, float], ensemble: TreeEnsemble, meta: dict[str, Any] | None = None,
                 *, floor: float = 0.0) -> None:
        unknown = set(coefficients) - set(FEATURES)
        if unknown:
            raise CostModelError(f"unknown cost-model features {sorted(unknown)}; known: {list(FEATURES)}")
        self.coefficients = {f: float(coefficients.get(f, 0.0)) for f in FEATURES}
        self._coef = [self.coefficients[f] for f in FEATURES]
        self.ensemble = ensemble
        self.floor = float(floor)  # no step is predicted shorter (the shortest step fitted, halved)
        self.meta = dict(meta or {})
        n_features = len(EXT_FEATURES)
        if any(f >= n_features for t in ensemble.trees for f in t.feature):
            raise CostModelError(f"a tree splits on a feature index >= {n_features}")
        self._context_cuts = ensemble.cuts(n_features)[_CONTEXT]
        self._decode_cells: dict[tuple[int, int], float] = {}  # (spans, context's bisection) -> trees

    def step_time(self, step: int, spans: list[Span]) -> float:
        x = ext_features(spans)
        if x[_PREFILLS]:
            trees = self.ensemble.predict_one(x)
        else:  # decode only: every feature but decode_context is 0, 1 or the span count, so the count
            # and the context's bisection name x's cell (most steps: one bisection instead of ten)
            key = (x[_DECODES], bisect_left(self._context_cuts, x[_CONTEXT]))
            trees = self._decode_cells.get(key)
            if trees is None:
                trees = self._decode_cells[key] = self.ensemble.predict_one(x)
        t = sum(map(mul, self._coef, x)) + trees  # Σ c·v, left to right
        t = max(t, self.floor)
        return t if self._overlap is None else self._overlapped(t, len(spans))

    def predict_ext(self, ext: np.ndarray) -> np.ndarray:
        """Durations for an [steps, EXT_FEATURES] matrix."""
        return np.maximum(ext[:, :_N] @ np.asarray(self._coef) + self.ensemble.predict(ext), self.floor)

    def evaluate(self, data: Any) -> dict[str, Any]:
        """Per-step MAPE and total-time error, overall and per log (``data``: a StepData)."""
        return prediction_errors(self.predict_ext(data.ext), data)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": 1, "kind": "trees", **self.meta, "features": FEATURE_DOC,
                "tree_features": list(EXT_FEATURES), "coefficients": self.coefficients, "floor": self.floor,
                **self.timed_parts(), "trees": self.ensemble.to_dict()}

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        doc = self.to_dict()
        trees = doc.pop("trees")
        # the metadata readable, the trees' arrays one compact line (most of the file)
        text = json.dumps(doc, indent=2)[:-2] + ',\n  "trees": ' + json.dumps(trees, separators=(",", ":")) + "\n}\n"
        Path(path).write_text(text)

    @classmethod
    def from_doc(cls, doc: dict[str, Any], path: str | Path = "") -> TreeCostModel:
        if doc.get("tree_features", list(EXT_FEATURES)) != list(EXT_FEATURES):
            raise CostModelError(f"{path}: trees over features {doc.get('tree_features')}, "
                                 f"expected {list(EXT_FEATURES)}")
        try:
            ensemble = TreeEnsemble.from_dict(doc["trees"])
            coefficients = doc.get("coefficients") or {}
            meta = {k: v for k, v in doc.items() if k not in (
                "format", "version", "kind", "features", "tree_features", "coefficients", "floor", "host", "ranges",
                "trees")}
            model = cls(coefficients, ensemble, meta, floor=float(doc.get("floor", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise CostModelError(f"{path}: malformed trees model: {e}") from None
        model.load_timed_parts(doc, path)
        return model
