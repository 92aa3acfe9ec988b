"""CPU threads: every core (one left to the front end beyond two), passive OpenMP waits set before
torch loads, a warning on a busy machine, and an explicit count kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime.engine.config import ConfigError
from runtime.executor.config import RunnerConfig
from runtime.executor.cpu_threads import busy_warning, choose_threads


@pytest.mark.parametrize("cores,threads", [(1, 1), (2, 2), (3, 2), (8, 7)])
def test_threads_are_the_cores_less_one_for_the_front_end_beyond_two(cores, threads):
    assert choose_threads(0, cores) == threads


def test_an_explicit_count_is_kept():
    assert choose_threads(3, 2) == 3


def test_a_busy_machine_is_named_in_a_warning():
    assert busy_warning(None, 2, 2) is None and busy_warning(0.2, 2, 2) is None
    assert busy_warning(1.9, 2, 1) == ("other processes keep 1.9 of 2 CPU cores busy: the engine runs 1 torch thread, "
                                       "and its steps will be slower and noisier than on a quiet machine")


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(ConfigError, match="cpu_threads"):
        RunnerConfig(cpu_threads=bad)


def test_the_cli_makes_openmp_wait_passively_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import os, sys\nfrom runtime.cli import main\ntry:\n    main(['workload', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[-2:] == ["PASSIVE", "False"], out.stdout + out.stderr
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # the user's choice is kept
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[-2] == "ACTIVE"
