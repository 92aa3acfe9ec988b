"""Jobs to results through the cache and a runner: each distinct key simulated once (two grid points
that simulate alike share a run), a cached key not at all, each result cached as it arrives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.planning.cache import ResultCache
from runtime.planning.job import PointJob, SharedInputs
from runtime.planning.runner import Outcome, Runner, RunStats


@dataclass
class Results:
    keys: list[str]  # of the jobs, in their order
    outcomes: dict[str, Outcome]  # by key
    stats: RunStats
    cached: int = 0  # keys found in the cache
    tasks: list[dict[str, Any]] = field(default_factory=list)  # per key run or read: how

    def metrics(self, i: int) -> dict[str, Any] | None:
        return self.outcomes[self.keys[i]].metrics

    def error(self, i: int) -> str | None:
        return self.outcomes[self.keys[i]].error


def execute(jobs: Sequence[PointJob], inputs: SharedInputs, runner: Runner, cache: ResultCache,
            progress: Any = None) -> Results:
    """``progress``: a tqdm-like bar, advanced once per distinct key (cached ones at once)."""
    keys = [inputs.key(job) for job in jobs]
    outcomes: dict[str, Outcome] = {}
    todo: dict[str, PointJob] = {}
    tasks: list[dict[str, Any]] = []
    cached = 0
    for key, job in zip(keys, jobs):
        if key in outcomes or key in todo:
            continue
        metrics = cache.get(key)
        if metrics is None:
            todo[key] = job
        else:
            outcomes[key] = Outcome(key, metrics, attempts=0)
            tasks.append({"key": key, "label": job.label, "cached": True, "attempts": 0, "task_s": 0.0, "worker": "",
                          "error": ""})
            cached += 1
    if progress is not None and cached:
        progress.update(cached)

    def done(outcome: Outcome) -> None:
        outcomes[outcome.key] = outcome
        if outcome.metrics is not None:
            cache.put(outcome.key, outcome.metrics)
        tasks.append({"key": outcome.key, "label": todo[outcome.key].label, "cached": False,
                      "attempts": outcome.attempts, "task_s": outcome.task_s, "worker": outcome.worker,
                      "error": outcome.error or ""})
        if progress is not None:
            progress.update(1)

    stats = runner.run(todo, inputs, done)
    return Results(keys, outcomes, stats, cached, tasks)
