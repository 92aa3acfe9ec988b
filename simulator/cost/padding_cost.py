"""The cost of a padded token, estimated where it can be told apart from everything else.

A fit over all steps cannot find it: a log's padding is fixed by its own mix of step sizes (a
code run's mixed steps are full 2,048-token chunks, a conv run's are not), so across logs it is
confounded with their levels. On the H200 fit set (one machine's served runs) the least-squares
fit of every step gives it 0, although within each conv run a padded token costs 0.6–1.3 µs. So it
is estimated within logs: least squares over the steps that carry prefill, one intercept per log,
beside the features that vary among those steps. The step models then take it
as given (LinearCostModel.fit) and the trees never split on it (simulator/fitting/fit.py).
"""

from __future__ import annotations

import numpy as np

from simulator.cost.features import FEATURES, PADDED

# what else varies among steps that carry prefill (const and prefill_step: the per-log intercepts)
_BESIDE = [i for i, name in enumerate(FEATURES) if name not in ("const", "prefill_step", "padded_tokens")]


def padding_cost(features: np.ndarray, durations: np.ndarray, log_index: np.ndarray | None) -> float:
    """Seconds per padded token (>= 0; 0 when no step was padded) of steps in ``FEATURES`` order."""
    rows = (features[:, FEATURES.index("prefill_tokens")] > 0) & (durations > 0)
    pad = features[rows, PADDED]
    if not pad.any():
        return 0.0
    logs = np.zeros(int(rows.sum()), dtype=int) if log_index is None else log_index[rows]
    intercepts = (logs[:, None] == np.unique(logs)[None, :]).astype(float)
    design = np.hstack([intercepts, features[rows][:, _BESIDE], pad[:, None]])
    coef, *_ = np.linalg.lstsq(design, durations[rows], rcond=None)
    return max(0.0, float(coef[-1]))
