"""Sweeps on Ray: the same table from 1 or 2 workers as in this process; a worker killed mid-task
costs a retry, reported, and no row; a point whose model fails is a failed row, the others go on."""

from __future__ import annotations

import pandas as pd
import pytest

from runtime.planning.cache import ResultCache
from runtime.planning.runner import LocalRunner
from runtime.planning.slo import Slo
from runtime.planning.sweep import run_sweep
from tests.planning_helpers import FailsOnBigBatches, KillsItsWorkerOnce, small_inputs, small_plan

ray = pytest.importorskip("ray")

SLO = Slo.parse("ttft_p99_ms=60,tpot_p99_ms=8")
pytestmark = pytest.mark.slow  # a Ray start: seconds


@pytest.fixture(scope="module")
def two_cpus():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 << 20)
    yield
    ray.shutdown()


def ray_sweep(workers: int, inputs=None, retries: int = 2):
    from runtime.planning.ray_runner import RayRunner

    with RayRunner(workers=workers, retries=retries) as runner:
        assert runner.slots == workers
        return run_sweep(small_plan(), inputs or small_inputs(), runner, ResultCache(None), SLO)


def test_one_or_two_workers_give_the_table_of_this_process(two_cpus):
    here, _ = run_sweep(small_plan(), small_inputs(), LocalRunner(), ResultCache(None), SLO)
    one, results1 = ray_sweep(1)
    two, results2 = ray_sweep(2)
    pd.testing.assert_frame_equal(here, one)
    pd.testing.assert_frame_equal(here, two)
    assert results1.stats.slots == 1 and results2.stats.slots == 2
    assert len({t["worker"] for t in results2.tasks}) == 2  # both workers simulated
    assert not results2.stats.retries and not results2.stats.failed


def test_a_killed_worker_costs_a_retry_and_loses_no_row(two_cpus, tmp_path):
    marker = tmp_path / "killed"
    inputs = small_inputs(KillsItsWorkerOnce(str(marker)))
    table, results = ray_sweep(2, inputs)
    assert marker.exists()  # a worker died in the middle of a simulation
    assert len(results.stats.retries) == 1 and not results.stats.failed
    assert results.stats.retries[0].error.startswith("WorkerCrashedError")
    assert (table["status"] == "ok").all() and len(table) == 16 and table["point"].is_unique
    assert sorted(t["attempts"] for t in results.tasks) == [1] * 11 + [2]
    # with the kill behind it the same model gives the same table in this process
    here, _ = run_sweep(small_plan(), inputs, LocalRunner(), ResultCache(None), SLO)
    pd.testing.assert_frame_equal(here, table)


def test_a_failing_point_is_reported_and_the_rest_go_on(two_cpus):
    table, results = ray_sweep(2, small_inputs(FailsOnBigBatches()), retries=1)
    here, _ = run_sweep(small_plan(), small_inputs(FailsOnBigBatches()), LocalRunner(retries=1), ResultCache(None), SLO)
    pd.testing.assert_frame_equal(here, table)
    failed = table[table["status"] == "failed"]
    assert 0 < len(failed) < len(table)
    assert failed["error"].str.contains("RuntimeError: no model for so many spans").all()
    assert len(results.stats.failed) == len(set(failed["key"]))
    assert all(r.attempt == 2 for r in results.stats.failed)
