"""How far a model's step times are from the recorded ones: per-step MAPE and total-time error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from simulator.cost.step_data import StepData


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


def prediction_errors(pred: np.ndarray, data: StepData) -> dict[str, Any]:
    """Per-step MAPE and total-time error of ``pred`` against the steps' durations, overall and per log."""
    out: dict[str, Any] = {"logs": data.logs, "steps": int(len(data.durations)),
                           "mape": mape(pred, data.durations), "total_error": total_error(pred, data.durations)}
    if data.log_index is not None and len(data.logs) > 1:
        out["per_log"] = {log: mape(pred[data.log_index == i], data.durations[data.log_index == i])
                          for i, log in enumerate(data.logs)}
    return out
