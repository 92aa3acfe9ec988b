"""Non-negative least squares (Lawson–Hanson active set) in numpy: scipy is not a dependency.

Step-time coefficients are physical costs (seconds per token, per pair, per step), so a negative
one is a fitting artifact that would predict negative times for some shapes.
"""

from __future__ import annotations

import numpy as np


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """argmin ||A x - b||₂ subject to x >= 0."""
    A = np.asarray(A, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = A.shape
    max_iter = max_iter or 3 * n + 10
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    tol = 10 * np.finfo(float).eps * np.abs(A).sum(axis=0).max(initial=0.0) * max(m, n)
    w = A.T @ (b - A @ x)
    for _ in range(max_iter):
        if passive.all() or not (w[~passive] > tol).any():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (s[passive] > 0).all():
                break
            # step from x toward s until the first passive coefficient hits zero
            neg = passive & (s <= 0) & (x - s > 0)
            alpha = float(np.min(x[neg] / (x[neg] - s[neg]))) if neg.any() else 0.0
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                s = x
                break
        x = s
        w = A.T @ (b - A @ x)
    return np.maximum(x, 0.0)
