"""Regression-tree ensembles as plain arrays: fitted by scikit-learn, evaluated without it.

A shipped cost model must load without unpickling anything and predict one simulated step in a
few microseconds, so a fitted ``GradientBoostingRegressor`` or ``RandomForestRegressor`` is
exported as arrays (per tree: feature, threshold, left, right, value — the layout of sklearn's
``tree_``) and JSON. Prediction: ``base + scale · Σ tree(x)`` (boosting: the initial estimate and
the learning rate; a forest: 0 and 1 / number of trees).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEAF = -1  # sklearn's TREE_LEAF: a node whose children are -1


@dataclass
class Tree:
    feature: list[int]
    threshold: list[float]
    left: list[int]
    right: list[int]
    value: list[float]

    def predict_one(self, x: Sequence[float]) -> float:
        node = 0
        left, right, feature, threshold = self.left, self.right, self.feature, self.threshold
        while left[node] != LEAF:
            node = left[node] if x[feature[node]] <= threshold[node] else right[node]
        return self.value[node]

    def predict(self, X: np.ndarray) -> np.ndarray:
        node = np.zeros(len(X), dtype=np.int64)
        left, right = np.asarray(self.left), np.asarray(self.right)
        feature, threshold = np.asarray(self.feature), np.asarray(self.threshold)
        rows = np.arange(len(X))
        while True:
            inner = left[node] != LEAF
            if not inner.any():
                return np.asarray(self.value)[node]
            n = node[inner]
            go_left = X[rows[inner], feature[n]] <= threshold[n]
            node[inner] = np.where(go_left, left[n], right[n])

    @classmethod
    def from_sklearn(cls, tree: Any) -> Tree:
        t = tree.tree_
        return cls(t.feature.astype(int).tolist(), t.threshold.astype(float).tolist(),
                   t.children_left.astype(int).tolist(), t.children_right.astype(int).tolist(),
                   t.value.reshape(-1).astype(float).tolist())

    def to_dict(self) -> dict[str, list]:
        return {"feature": self.feature, "threshold": self.threshold, "left": self.left, "right": self.right,
                "value": self.value}

    @classmethod
    def from_dict(cls, d: dict[str, list]) -> Tree:
        tree = cls([int(v) for v in d["feature"]], [float(v) for v in d["threshold"]],
                   [int(v) for v in d["left"]], [int(v) for v in d["right"]], [float(v) for v in d["value"]])
        n = len(tree.value)
        if not (len(tree.feature) == len(tree.threshold) == len(tree.left) == len(tree.right) == n) or not n:
            raise ValueError("tree arrays must be non-empty and of equal length")
        if any(not (c == LEAF or 0 < c < n) for c in tree.left + tree.right):
            raise ValueError("tree child index out of range")
        return tree


@dataclass
class TreeEnsemble:
    trees: list[Tree]
    base: float = 0.0
    scale: float = 1.0

    def predict_one(self, x: Sequence[float]) -> float:
        return self.base + self.scale * sum(t.predict_one(x) for t in self.trees)

    def predict(self, X: np.ndarray) -> np.ndarray:
        out = np.zeros(len(X))
        for t in self.trees:
            out += t.predict(X)
        return self.base + self.scale * out

    @classmethod
    def from_sklearn(cls, est: Any) -> TreeEnsemble:
        """A fitted GradientBoostingRegressor (squared error) or RandomForestRegressor."""
        name = type(est).__name__
        if name == "GradientBoostingRegressor":
            base = float(np.asarray(est.init_.constant_).reshape(-1)[0])
            return cls([Tree.from_sklearn(t) for t in est.estimators_[:, 0]], base, float(est.learning_rate))
        if name == "RandomForestRegressor":
            return cls([Tree.from_sklearn(t) for t in est.estimators_], 0.0, 1.0 / len(est.estimators_))
        raise TypeError(f"cannot export a {name}")

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "scale": self.scale, "trees": [t.to_dict() for t in self.trees]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeEnsemble:
        return cls([Tree.from_dict(t) for t in d["trees"]], float(d.get("base", 0.0)), float(d.get("scale", 1.0)))
