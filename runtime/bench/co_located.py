"""A co-located profile: K engines sweeping one device at once, each from the same moment.

``minivllm profile --co-located K`` starts K copies of itself (``--co-located-member i/K/DIR``), each
building the engine of the same flags (on a GPU, a 1/K share of its memory, as ``serve
--data-parallel-size K`` gives each replica: runtime/executor/kv_cache.py), warming up, and then
waiting at a barrier (a file per member in DIR) until all K are ready. Their sweeps then run
together for a time limit, the cases in one shuffled order so the engines run like shapes side by
side. Each writes its own log; the fit (simulator/fitting/co_located.py) prices their steps by the
model of the engine alone.
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BARRIER_TIMEOUT = 600.0  # s a member waits for the others to be ready


@dataclass(frozen=True)
class Member:
    index: int
    of: int
    barrier: Path

    @classmethod
    def parse(cls, text: str) -> Member:
        index, of, barrier = text.split("/", 2)
        return cls(int(index), int(of), Path(barrier))

    def wait_for_the_others(self, timeout: float = BARRIER_TIMEOUT) -> float:
        """Ready: wait until every member is (their sweeps then start together); the time then
        (``time.monotonic``)."""
        (self.barrier / str(self.index)).touch()
        deadline = time.monotonic() + timeout
        while len(list(self.barrier.iterdir())) < self.of:
            if time.monotonic() > deadline:
                raise RuntimeError(f"co-located member {self.index}: the other engines were not ready after "
                                   f"{timeout:.0f} s")
            time.sleep(0.005)
        return time.monotonic()


def member_plan(plan: list, seed: int = 0) -> list:
    """Every member's cases, in one order: shuffled, so a time limit cuts a sample of every kind."""
    plan = list(plan)
    random.Random(seed).shuffle(plan)
    return plan


def run_members(command: Sequence[str], logs: Sequence[Path], timeout: float) -> None:
    """Start ``len(logs)`` members (``command`` + ``--out LOG --co-located-member i/K/DIR``), all at
    once; wait for every one. A member that fails ends the rest, and the error names its last line."""
    Path(logs[0]).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="co_located_") as barrier:
        procs = []
        for i, log in enumerate(logs):
            out = Path(log).with_suffix(".log")
            procs.append((subprocess.Popen([*command, "--out", str(log), "--co-located-member",
                                            f"{i}/{len(logs)}/{barrier}"],
                                           stdout=out.open("w"), stderr=subprocess.STDOUT), out))
        deadline = time.monotonic() + timeout
        failed = None
        for proc, out in procs:
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            if code != 0 and failed is None:
                failed = (out, code)
                for other, _ in procs:
                    other.kill()
        if failed is not None:
            out, code = failed
            lines = out.read_text().strip().splitlines() if out.exists() else []
            why = "did not finish in time" if code is None else f"exited {code}"
            raise RuntimeError(f"a co-located engine {why}: {lines[-1] if lines else 'no output'} (its output: {out})")


def python_command() -> list[str]:
    return [sys.executable, "-m", "runtime"]
