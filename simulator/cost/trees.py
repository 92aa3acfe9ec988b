"""Regression-tree ensembles as plain arrays: fitted by scikit-learn, evaluated without it.

A shipped cost model must load without unpickling anything and predict one simulated step in a
few microseconds, so a fitted ``GradientBoostingRegressor`` or ``RandomForestRegressor`` is
exported as arrays (per tree: feature, threshold, left, right, value — the layout of sklearn's
``tree_``) and JSON. Prediction: ``base + scale · Σ tree(x)`` (boosting: the initial estimate and
the learning rate; a forest: 0 and 1 / number of trees).

Walking hundreds of trees for every simulated step takes ~100 µs, so ``predict_one`` remembers its
answer per *cell*: every split asks ``x[f] <= threshold``, so which side of each of feature f's
thresholds x lies on, ``bisect_left(sorted thresholds of f, x[f])``, decides every split, and
vectors with the same bisections (most consecutive steps) walk every tree alike. The cached value
is the one the walk computed: predictions are bit for bit those of walking the trees.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
        children = list(enumerate(tree.left)) + list(enumerate(tree.right))
        if any(not (c == LEAF or i < c < n) for i, c in children):
            raise ValueError("tree child index out of range (a child comes after its parent)")
        return tree


@dataclass
class TreeEnsemble:
    trees: list[Tree]
    base: float = 0.0
    scale: float = 1.0
    # predict_one's memo (see the module docstring): per feature its sorted split thresholds, and
    # cell (bisections) -> prediction
    _cuts: list[list[float]] | None = field(default=None, repr=False, compare=False)
    _cells: dict[tuple[int, ...], float] = field(default_factory=dict, repr=False, compare=False)
    _packed: tuple[np.ndarray, ...] | None = field(default=None, repr=False, compare=False)

    MAX_CELLS = 1 << 20  # forget them all past this many (a pathological walk of the feature space)

    def walk(self, x: Sequence[float]) -> float:
        """The prediction for ``x``, every tree walked: all of them a level at a time (numpy), their
        leaves' values then summed in tree order, as ``sum(t.predict_one(x) for t in trees)`` adds
        them (the same bits, about five times faster than walking one tree after another)."""
        packed = self._packed
        if packed is None:
            packed = self._packed = self._pack()
        node, feature, threshold, left, right, value, depth = packed
        v = np.asarray(x, dtype=np.float64)
        for _ in range(depth):
            node = np.where(v[feature[node]] <= threshold[node], left[node], right[node])
        return self.base + self.scale * sum(value[node].tolist())

    def _pack(self) -> tuple[Any, ...]:
        """Every tree's nodes in one set of arrays, and the roots and the deepest leaf's depth. A
        leaf is its own child, at +inf on feature 0, so walking on past it stays there."""
        feature: list[int] = []
        threshold: list[float] = []
        left: list[int] = []
        right: list[int] = []
        value: list[float] = []
        roots: list[int] = []
        depth = 0
        for t in self.trees:
            offset = len(feature)
            roots.append(offset)
            for i, (f, th, lo, hi) in enumerate(zip(t.feature, t.threshold, t.left, t.right)):
                leaf = lo == LEAF
                feature.append(0 if leaf else f)
                threshold.append(np.inf if leaf else th)
                left.append(offset + (i if leaf else lo))
                right.append(offset + (i if leaf else hi))
            value += t.value
            level, tree_depth = [0], 0
            while any(t.left[i] != LEAF for i in level):
                level = [c for i in level if t.left[i] != LEAF for c in (t.left[i], t.right[i])]
                tree_depth += 1
            depth = max(depth, tree_depth)
        ints = [np.asarray(a, dtype=np.int64) for a in (roots, feature)]
        return (*ints, np.asarray(threshold, dtype=np.float64), np.asarray(left, dtype=np.int64),
                np.asarray(right, dtype=np.int64), np.asarray(value, dtype=np.float64), depth)

    def cuts(self, n: int) -> list[list[float]]:
        """Per feature (at least ``n`` of them) its sorted split thresholds: ``x``'s cell is
        ``bisect_left(cuts[f], x[f])`` for each feature f."""
        cuts = self._cuts
        if cuts is None or n > len(cuts):
            cuts = self._cuts = self._thresholds(n)
        return cuts

    def predict_one(self, x: Sequence[float]) -> float:
        cuts = self._cuts
        if cuts is None or len(x) > len(cuts):
            cuts = self.cuts(len(x))
        cell = tuple(map(bisect_left, cuts, x))
        value = self._cells.get(cell)
        if value is None:
            if len(self._cells) >= self.MAX_CELLS:
                self._cells.clear()
            value = self._cells[cell] = self.walk(x)
        return value

    def scaled(self, factor: float) -> TreeEnsemble:
        """These trees with every prediction multiplied by ``factor`` (the same trees and splits,
        remembered predictions of its own)."""
        return replace(self, base=self.base * factor, scale=self.scale * factor, _cells={})

    def forget(self) -> None:
        """Drop the remembered predictions (after ``base`` or ``scale`` changed)."""
        self._cells.clear()

    def _thresholds(self, n: int) -> list[list[float]]:
        by_feature: list[set[float]] = [set() for _ in range(max(n, 1 + max((f for t in self.trees for f in t.feature),
                                                                             default=-1)))]
        for t in self.trees:
            for f, threshold, left in zip(t.feature, t.threshold, t.left):
                if left != LEAF:
                    by_feature[f].add(threshold)
        return [sorted(s) for s in by_feature]

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

    def renumber(self, index: list[int]) -> None:
        """Feature ``f`` of every split becomes ``index[f]`` (the same feature in another order)."""
        if index == list(range(len(index))):
            return
        for t in self.trees:
            t.feature = [index[f] if left != LEAF else f for f, left in zip(t.feature, t.left)]
        self.forget()
        self._cuts = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeEnsemble:
        return cls([Tree.from_dict(t) for t in d["trees"]], float(d.get("base", 0.0)), float(d.get("scale", 1.0)))
