"""Running jobs: what a runner reports per job (``Outcome``) and per run (``RunStats``), and the
runner of this process (``LocalRunner``: one job after another; what Ray's runner is checked against).

A runner takes jobs by key and calls ``on_done`` once per key, in whatever order the jobs end: with
the metrics, or, after ``retries`` more attempts have failed too, with the last error. Neither the
order nor the number of attempts changes a job's metrics.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.planning.job import PointJob, SharedInputs


@dataclass(frozen=True)
class Outcome:
    key: str
    metrics: dict[str, Any] | None
    error: str | None = None  # the last attempt's, when every attempt failed
    attempts: int = 1
    task_s: float = 0.0  # seconds the successful attempt took inside its task
    worker: str = ""


@dataclass(frozen=True)
class Retry:
    label: str
    attempt: int  # the attempt that failed (1 = the first)
    error: str


@dataclass
class RunStats:
    """``wall_s``: from the first job handed out to the last one back; ``slots``: jobs that can run at
    once. What the slots spent beyond the tasks' own time, per task, is the runner's overhead."""

    tasks: int = 0
    slots: int = 1
    wall_s: float = 0.0
    task_s: float = 0.0  # Σ over the tasks that succeeded
    retries: list[Retry] = field(default_factory=list)
    failed: list[Retry] = field(default_factory=list)

    @property
    def overhead_per_task_s(self) -> float:
        busy = self.wall_s * min(self.slots, max(self.tasks, 1))
        return (busy - self.task_s) / self.tasks if self.tasks else 0.0

    @property
    def mean_task_s(self) -> float:
        return self.task_s / self.tasks if self.tasks else 0.0

    def merge(self, other: RunStats) -> None:
        self.tasks += other.tasks
        self.wall_s += other.wall_s
        self.task_s += other.task_s
        self.retries += other.retries
        self.failed += other.failed


OnDone = Callable[[Outcome], None]


class Runner(Protocol):
    slots: int
    startup_s: float  # starting the runner and readying its workers, outside every run's wall time

    def run(self, jobs: Mapping[str, PointJob], inputs: SharedInputs, on_done: OnDone) -> RunStats: ...


def describe_error(error: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def timed_point(job: PointJob, inputs: SharedInputs) -> tuple[dict[str, Any], float]:
    from runtime.planning.point_run import simulate_point

    t0 = time.perf_counter()
    metrics = simulate_point(job, inputs.workload, inputs.cost_model, inputs.cost_model_name, inputs.speculation)
    return metrics, time.perf_counter() - t0


class LocalRunner:
    """The jobs one after another in this process."""

    slots = 1
    startup_s = 0.0

    def __init__(self, retries: int = 1) -> None:
        self.retries = retries

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def run(self, jobs: Mapping[str, PointJob], inputs: SharedInputs, on_done: OnDone) -> RunStats:
        stats = RunStats(tasks=len(jobs), slots=1)
        t0 = time.perf_counter()
        for key, job in jobs.items():
            for attempt in range(1, self.retries + 2):
                try:
                    metrics, task_s = timed_point(job, inputs)
                except Exception as e:  # a failed point is reported; the others go on
                    failure = Retry(job.label, attempt, describe_error(e))
                    if attempt <= self.retries:
                        stats.retries.append(failure)
                        continue
                    stats.failed.append(failure)
                    on_done(Outcome(key, None, failure.error, attempt))
                    break
                stats.task_s += task_s
                on_done(Outcome(key, metrics, None, attempt, task_s, f"{os.getpid()}@local"))
                break
        stats.wall_s = time.perf_counter() - t0
        return stats
