"""Output piped into a reader that stops early (``| head -1``) ends quietly: exit status 141 (128 +
SIGPIPE, what a shell shows for ``cat`` in the same place), nothing on stderr, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime.cli import EXIT_BROKEN_PIPE
from tests.sim_helpers import DATA, REPO


def _run_into_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``minivllm argv`` with stdout a pipe whose reader has already gone (``head`` after its
    line): deterministic, unlike racing a real ``head``."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "runtime", *argv], stdout=write, stderr=subprocess.PIPE,
                              cwd=REPO, timeout=120, text=True)
    finally:
        os.close(write)


@pytest.fixture(scope="module")
def sim_log(tmp_path_factory):
    from runtime.cli import main

    out = tmp_path_factory.mktemp("pipe") / "sim.jsonl"
    assert main(["simulate", str(DATA / "azure_conv_head200.csv"), "--cost-model", "qwen3-0.6b-h200",
                 "--limit", "20", "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("argv", [
    ["workload", "info", str(DATA / "azure_conv_head200.csv")],
    ["analyze", "{log}"],
], ids=["workload info", "analyze"])
def test_a_closed_pipe_ends_quietly(argv, sim_log):
    done = _run_into_closed_pipe([a.format(log=sim_log) for a in argv])
    assert done.returncode == EXIT_BROKEN_PIPE
    assert done.stderr == ""


def test_head_reads_the_first_line(sim_log):
    """The real thing: ``minivllm analyze LOG | head -1``."""
    head = subprocess.run(f"{sys.executable} -m runtime analyze {sim_log} | head -1", shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert head.stdout.strip() == sim_log.name
    assert "Traceback" not in head.stderr and "BrokenPipe" not in head.stderr
