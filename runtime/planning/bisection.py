"""Searches over a predicate that holds below a threshold and fails above it, one probe at a time:
``next_probe()`` says where to look (None: done), ``record(x, ok)`` what was seen there. Many
searches then share one pool of workers: each round runs every live search's next probe at once.

``HighestPassing``: the highest load (a positive number) at which the predicate holds. From
``start`` it doubles while the predicate holds and halves while it fails until one load passes
and one fails, then bisects the bracket at its geometric middle until the two are within
``tolerance`` of each other (relative). The answer is the highest passing load probed.

``FewestPassing``: the fewest (an integer from 1) for which the predicate holds: doubling from 1
until one passes, then bisection of the integers between the last failing and the first passing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class HighestPassing:
    start: float = 1.0
    tolerance: float = 0.02
    lowest: float = 1 / 1024  # below this a load counts as none: nothing passes
    highest: float = 1024.0  # above this the search stops: everything up to it passes
    passing: float | None = None  # the highest load seen to pass
    failing: float | None = None  # the lowest load seen to fail
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def next_probe(self) -> float | None:
        lo, hi = self.passing, self.failing
        if lo is None and hi is None:
            return self.start
        if hi is None:
            return None if lo >= self.highest else min(lo * 2, self.highest)
        if lo is None:
            return None if hi <= self.lowest else max(hi / 2, self.lowest)
        if hi / lo - 1 <= self.tolerance:
            return None
        return math.sqrt(lo * hi)

    def record(self, x: float, ok: bool) -> None:
        self.probes.append((x, ok))
        if ok:
            if self.passing is None or x > self.passing:
                self.passing = x
        elif self.failing is None or x < self.failing:
            self.failing = x

    @property
    def answer(self) -> float | None:
        """The highest passing load (None: even the lowest failed)."""
        return self.passing

    @property
    def bounded(self) -> bool:
        """A failing load is known above the answer (else the answer is only a lower bound)."""
        return self.failing is not None

    @property
    def monotone(self) -> bool:
        """No load passed above one that failed."""
        return self.passing is None or self.failing is None or self.passing < self.failing


@dataclass
class FewestPassing:
    most: int = 64  # no more than this many are tried
    passing: int | None = None  # the fewest seen to pass
    failing: int = 0  # the most seen to fail
    probes: list[tuple[int, bool]] = field(default_factory=list)

    def next_probe(self) -> int | None:
        if self.passing is None:
            if self.failing >= self.most:
                return None
            return min(max(1, self.failing * 2), self.most)
        if self.passing - self.failing <= 1:
            return None
        return (self.passing + self.failing) // 2

    def record(self, n: int, ok: bool) -> None:
        self.probes.append((n, ok))
        if ok:
            if self.passing is None or n < self.passing:
                self.passing = n
        elif n > self.failing:
            self.failing = n

    @property
    def answer(self) -> int | None:
        """The fewest passing (None: not even ``most`` pass)."""
        return self.passing
