"""Jobs as Ray tasks: one task per simulation, on this machine's cores (``ray.init()``) or on a cluster
(``address``).

The workload, the cost model and the acceptance rates go into Ray's object store once; a worker
process reads them on its first task and keeps them for the next. Only the metrics row comes back
(a run's event log is written on its worker, where a job asks for one). Ray retries nothing by
itself (``max_retries=0``): a task whose worker died or that raised is handed out again here, up
to ``retries`` more times, and every retry is reported; the other tasks go on. A job's result is
the same whichever worker ran it and whichever attempt succeeded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.planning.job import PointJob, SharedInputs
from runtime.planning.runner import OnDone, Outcome, Retry, RunStats, describe_error, timed_point

LOCAL_OBJECT_STORE_BYTES = 256 << 20  # a run's objects: a workload, a cost model and the rows
# the packages a point's code lives in, sent to a cluster's workers (they import this checkout's code)
PACKAGES = ("runtime", "simulator", "traces", "analysis")

_shared: dict[str, SharedInputs] = {}  # in a worker process: the inputs of the runs it served, by digest


def _inputs(digest: str, boxed: list) -> SharedInputs:
    import copy

    import ray

    inputs = _shared.get(digest)
    if inputs is None:
        # a copy: what ray.get returns may be read-only views of the object store
        inputs = copy.deepcopy(ray.get(boxed[0]))
        _shared.clear()
        _shared[digest] = inputs
    return inputs


def _warm(digest: str, boxed: list) -> int:
    """A worker ready to simulate: the simulation's modules imported, the run's inputs read."""
    import runtime.planning.point_run  # noqa: F401

    _inputs(digest, boxed)
    return os.getpid()


def _task(job: PointJob, digest: str, boxed: list) -> tuple[dict[str, Any], float, str]:
    import ray

    metrics, task_s = timed_point(job, _inputs(digest, boxed))
    node = ray.get_runtime_context().get_node_id()[:8]
    return metrics, task_s, f"{os.getpid()}@{node}"


class RayRunner:
    def __init__(self, workers: int | None = None, address: str | None = None, retries: int = 2) -> None:
        """``workers``: tasks at once (default: every core here, or every CPU of the cluster); a
        Ray already started in this process is used as it is (and left running).
        ``startup_s``: seconds spent starting Ray and readying its workers, before any job's clock."""
        self.workers, self.address, self.retries = workers, address, retries
        self.slots = 1
        self.startup_s = 0.0
        self._started = False

    def __enter__(self) -> RayRunner:
        import ray

        t0 = time.perf_counter()
        quiet = {"logging_level": logging.WARNING, "log_to_driver": False, "include_dashboard": False}
        if ray.is_initialized():  # Ray already up in this process (a test's, a notebook's): use it as it is
            pass
        elif self.address is not None:
            root = Path(__file__).resolve().parents[2]
            ray.init(address=self.address, runtime_env={"py_modules": [str(root / p) for p in PACKAGES]}, **quiet)
            self._started = True
        else:
            # Ray runs its workers at nice 15 (its own processes first); here they are the work
            # "local": a Ray of its own, even where a cluster was started here (``ray start``)
            ray.init(address="local", num_cpus=self.workers or os.cpu_count() or 1,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, _system_config={"worker_niceness": 0}, **quiet)
            self._started = True
        cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
        self.slots = min(self.workers or cpus, cpus)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_task)
        self._warm = ray.remote(num_cpus=1, max_retries=0)(_warm)
        self._warmed: set[str] = set()
        self.startup_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray

        if self._started:
            ray.shutdown()
            self._started = False

    def run(self, jobs: Mapping[str, PointJob], inputs: SharedInputs, on_done: OnDone) -> RunStats:
        import ray

        stats = RunStats(tasks=len(jobs), slots=self.slots)
        if not jobs:
            return stats
        boxed = [ray.put(inputs)]  # in a list: Ray hands it over as a reference, read once per worker
        digest = inputs.digest
        if digest not in self._warmed:  # every worker started and ready before the clock starts
            t0 = time.perf_counter()
            ray.get([self._warm.remote(digest, boxed) for _ in range(self.slots)])
            self._warmed.add(digest)
            self.startup_s += time.perf_counter() - t0
        attempts: dict[str, int] = {}
        pending: dict[Any, str] = {}

        def submit(key: str) -> None:
            attempts[key] = attempts.get(key, 0) + 1
            pending[self._remote.remote(jobs[key], digest, boxed)] = key

        queue = list(jobs)[::-1]  # handed out in order, ``slots`` at a time: that many run at once
        t0 = time.perf_counter()
        try:
            while queue and len(pending) < self.slots:
                submit(queue.pop())
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    key = pending.pop(ref)
                    try:
                        metrics, task_s, worker = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        failure = Retry(jobs[key].label, attempts[key], _ray_error(e))
                        if attempts[key] <= self.retries:
                            stats.retries.append(failure)
                            queue.append(key)  # the next handed out
                        else:
                            stats.failed.append(failure)
                            on_done(Outcome(key, None, failure.error, attempts[key]))
                    else:
                        stats.task_s += task_s
                        on_done(Outcome(key, metrics, None, attempts[key], task_s, worker))
                    while queue and len(pending) < self.slots:
                        submit(queue.pop())
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            stats.wall_s = time.perf_counter() - t0
        return stats


def _ray_error(error: BaseException) -> str:
    """What went wrong, in one line: the task's own exception, or how its worker was lost."""
    import ray

    if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
        return describe_error(error.cause)
    return describe_error(error)
