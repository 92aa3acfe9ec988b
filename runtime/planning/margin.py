"""How far a cost model's answer can be off: the step-time error it was measured to have.

A model fitted by ``minivllm cost-model fit`` records its error on held-out steps
(``meta["heldout"]["mape"]``: mean absolute error per step, in %). A search answers three times:
with the model as it is, with every step that many % slower and that many % faster; the slower
answer is the one that holds even if the model is wrong by that much on every step. That is a
bound: the error of a run's summed step time is far smaller (``heldout.total_error``; and the
machines measured differ by 0-1.6 %, docs/BENCHMARKS.md, "Simulator fidelity").
"""

from __future__ import annotations

import math
from typing import Any

NOMINAL, SLOWER, FASTER = "nominal", "slower", "faster"


def measured_error_pct(model: Any) -> float | None:
    """The model's held-out per-step error in %, None where it records none."""
    heldout = (getattr(model, "meta", None) or {}).get("heldout") or {}
    value = heldout.get("mape")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


def step_scales(margin_pct: float) -> dict[str, float]:
    """The step-time factor of each answer (only the nominal one without a margin)."""
    if margin_pct <= 0:
        return {NOMINAL: 1.0}
    return {NOMINAL: 1.0, SLOWER: 1 + margin_pct / 100, FASTER: 1 - margin_pct / 100}
