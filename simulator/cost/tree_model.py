"""A non-linear step-time model: a linear base plus a tree ensemble over the extended features.

``step_time = Σ coefficient · feature + ensemble(ext_features)``. With a zero base the trees
model the duration alone (as Vidur's random forests do); with a least-squares base they model its
residual, which keeps the linear part's extrapolation beyond the fitted shapes (trees are flat
there) while the trees pick up what a line cannot: GEMMs padded to 16 rows on the CPU, the jump
from a CUDA-graph decode step to an eager mixed one, a kernel's switch of tile size.

Saved as JSON (``kind: "trees"``): the coefficients, the trees as arrays (simulator/cost/trees.py), and
the parts every fitted model has (model_base.TimedModel). No pickle.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Container, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.cost.cost_model import CostModelError
from simulator.cost.features import (
    EXT_FEATURES,
    FEATURE_DOC,
    FEATURES,
    current_name,
    current_names,
    decode_ext_features,
    ext_features,
)
from simulator.cost.model_base import FORMAT, TIMED_PARTS, TimedModel
from simulator.cost.trees import TreeEnsemble
from traces.events import Span

if TYPE_CHECKING:
    from typing_extensions import Self

    from simulator.cost.step_data import StepData

_N = len(FEATURES)
_CONTEXT = FEATURES.index("decode_context")
_LONGEST = FEATURES.index("longest_program")


class TreeCostModel(TimedModel):
    def __init__(self, coefficients: dict[str, float], ensemble: TreeEnsemble, meta: dict[str, Any] | None = None,
                 *, floor: float = 0.0) -> None:
        unknown = set(coefficients) - set(FEATURES)
        if unknown:
            raise CostModelError(f"unknown cost-model features {sorted(unknown)}; known: {list(FEATURES)}")
        self.coefficients = {f: float(coefficients.get(f, 0.0)) for f in FEATURES}
        self.ensemble = ensemble
        self.floor = float(floor)  # no step is predicted shorter (the shortest step fitted, halved)
        self.meta = dict(meta or {})
        n_features = len(EXT_FEATURES)
        if any(f >= n_features for t in ensemble.trees for f in t.feature):
            raise CostModelError(f"a tree splits on a feature index >= {n_features}")
        cuts = ensemble.cuts(n_features)
        self._context_cuts, self._longest_cuts = cuts[_CONTEXT], cuts[_LONGEST]
        self._derive()

    def _derive(self) -> None:
        """What step_time remembers of the coefficients and the trees (a new model's own)."""
        self._coef = [self.coefficients[f] for f in FEATURES]
        # a decode-only step's linear part, left to right as ``_any_step`` adds it: const, then 0
        # prefill tokens and attention; after the span count, context and count, 0.0 prefill_step,
        # then the longest program
        c = self._coef
        self._decode_base, self._decode_last = 0 + c[0] * 1.0 + c[1] * 0 + c[2] * 0, c[6] * 0.0
        # per span count n of a decode-only step: its linear part's terms that depend on n alone,
        # base + c3·n and c5·n, and the trees' value per cell (the bisections of the context sum and
        # of the longest program, as one int)
        self._decode_rows: dict[int, tuple[float, float, dict[int, float]]] = {}
        self._longest_cells = len(self._longest_cuts) + 1

    def scaled(self, factor: float) -> Self:
        """This model with every step time it predicts multiplied by ``factor``."""
        return self._evolve(coefficients={k: v * factor for k, v in self.coefficients.items()},
                            ensemble=self.ensemble.scaled(factor), floor=self.floor * factor)

    def step_time(self, step: int, spans: Sequence[Span], verifying: Container[int] = ()) -> float:
        context = longest = 0
        for s in spans:
            if s.num_tokens != 1:
                trees, t = self._any_step(spans, verifying)
                return self._finish(t + trees, len(spans))
            context += s.start
            if s.start >= longest:
                longest = s.start + 1
        n = len(spans)
        return self.decode_time(n, context + n, longest)

    def decode_time(self, n: int, context: int, longest: int) -> float:
        """``step_time`` of a decode-only step (most steps) of ``n`` spans, ``context`` = Σ (start + 1)
        and ``longest`` = the largest start + 1: every other feature is 0, 1 or ``n``, so ``n`` and
        two bisections (the context sum, the longest program) name the trees' cell."""
        if self.decode_splits is not None:
            longest = self.decode_splits.longest_program(longest, n)
        base_n, seqs_n, cells = self._decode_rows.get(n) or self._new_decode_row(n)
        # (as floats, as the thresholds are: the same bisection, all of them far below 2**53)
        cell = (bisect_left(self._context_cuts, float(context)) * self._longest_cells
                + bisect_left(self._longest_cuts, float(longest)))
        trees = cells.get(cell)
        if trees is None:
            trees = cells[cell] = self.ensemble.predict_one(decode_ext_features(n, context, longest))
        # Σ c·v left to right, as _any_step adds it: const, decode_seqs, context, seqs, then 0
        # prefill_step (its constant terms summed once: _decode_base, _decode_last), longest program
        t = (base_n + self._coef[4] * context + seqs_n) + self._decode_last + self._coef[7] * longest
        return self._finish(t + trees, n)

    def decode_durations(self, n: int, context: int, longest: int, end: float, count: int,
                         due: float) -> list[float]:
        """TimedModel.decode_durations with ``decode_time``'s arithmetic inlined (the simulator's
        runs of decode steps spend most of their time here): the same durations, bit for bit."""
        base_n, seqs_n, cells = self._decode_rows.get(n) or self._new_decode_row(n)
        c_context, last, c_longest = self._coef[4], self._decode_last, self._coef[7]
        context_cuts, longest_cuts, width = self._context_cuts, self._longest_cuts, self._longest_cells
        program = None if self.decode_splits is None else self.decode_splits.longest_program
        floor = self.floor
        overlap = self._overlap is not None
        host = launch = 0.0
        if overlap:
            host, per_span, launch = self._overlap  # type: ignore[misc]
            host = host + per_span * n
        out: list[float] = []
        for i in range(count):
            ctx = context + n * i
            mx = longest + i if program is None else program(longest + i, n)
            cell = bisect_left(context_cuts, float(ctx)) * width + bisect_left(longest_cuts, float(mx))
            trees = cells.get(cell)
            if trees is None:
                trees = cells[cell] = self.ensemble.predict_one(decode_ext_features(n, ctx, mx))
            t = (base_n + c_context * ctx + seqs_n) + last + c_longest * mx + trees
            if floor > t:
                t = floor
            if overlap:
                t = (host if host > t else t) + launch
            end += t
            if end >= due:
                break
            out.append(t)
        return out

    def _new_decode_row(self, n: int) -> tuple[float, float, dict[int, float]]:
        """The ``_decode_rows`` entry of a decode-only step of ``n`` spans, made on first use: its linear
        part's terms in n alone and its trees' cells. (Callers look the dict up first: that lookup is
        the per-step path.)"""
        c = self._coef
        row = self._decode_rows[n] = (self._decode_base + c[3] * n, c[5] * n, {})
        return row

    def _finish(self, t: float, spans: int) -> float:
        """No less than the floor; with overlapping steps, max(host, device) + launch."""
        if self.floor > t:  # (max(t, floor) without a call)
            t = self.floor
        if self._overlap is None:
            return t
        host, per_span, launch = self._overlap
        host = host + per_span * spans
        return (host if host > t else t) + launch

    def _any_step(self, spans: Sequence[Span], verifying: Container[int] = ()) -> tuple[float, float]:
        """The trees' value and the linear part of any step."""
        x = ext_features(spans, self.decode_splits, self.padding, verifying)
        c0, c1, c2, c3, c4, c5, c6, c7, c8 = self._coef
        one, pt, pa, ds, dc, ns, ps, mx, pad = x[:_N]
        t = 0 + c0 * one + c1 * pt + c2 * pa + c3 * ds + c4 * dc + c5 * ns + c6 * ps + c7 * mx
        return self.ensemble.predict_one(x), t + c8 * pad if pad else t

    def predict_ext(self, ext: np.ndarray) -> np.ndarray:
        """Durations for an [steps, EXT_FEATURES] matrix."""
        return np.maximum(ext[:, :_N] @ np.asarray(self._coef) + self.ensemble.predict(ext), self.floor)

    def predict_steps(self, data: StepData) -> np.ndarray:
        """The step times of a StepData's rows."""
        return self.predict_ext(data.ext)


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
        names = [current_name(name) for name in doc.get("tree_features", EXT_FEATURES)]
        unknown = set(names) - set(EXT_FEATURES)
        if unknown:
            raise CostModelError(f"{path}: trees over unknown features {sorted(unknown)}; known: {list(EXT_FEATURES)}")
        try:
            ensemble = TreeEnsemble.from_dict(doc["trees"])
            # a file from before a feature was added numbers its features otherwise: map by name
            ensemble.renumber([EXT_FEATURES.index(name) for name in names])
            coefficients = current_names(doc.get("coefficients") or {})
            meta = {k: v for k, v in doc.items() if k not in (
                "format", "version", "kind", "features", "tree_features", "coefficients", "floor", "trees",
                *TIMED_PARTS)}
            model = cls(coefficients, ensemble, meta, floor=float(doc.get("floor", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise CostModelError(f"{path}: malformed trees model: {e}") from None
        return model.with_timed_parts(doc, path)
