"""torch's threads on the CPU: as many as the cores other processes leave free, waiting passively.

On a busy CPU, OpenMP threads that spin while they wait collapse: every parallel op ends in a
barrier, and a barrier waits out the scheduler slice of whichever thread another process
displaced (a 256-token prefill that takes 0.3 s alone took 10-20 s beside two CPU-bound
processes on two cores). ``OMP_WAIT_POLICY=PASSIVE`` makes a waiting thread sleep instead; the
OpenMP runtime reads it once, when it loads (with torch), so the CLI sets it before anything
imports torch and an engine process it spawns inherits it.

The thread count is the cores this process may run on, less one for the front end and the client
on a machine of more than two. It is not lowered when other processes are busy: the scheduler
shares a core among runnable threads, so fewer threads only give the engine a smaller share (on
two cores beside two CPU-bound processes, one thread made decode steps 2.2x slower than on the
quiet machine, two passive threads 1.2-2.1x). A busy machine is reported instead (``busy_warning``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

WAIT_POLICY = "OMP_WAIT_POLICY"
BUSY_WARNING = 0.5  # cores kept busy by other processes worth a warning


def wait_passively() -> None:
    """Sleeping OpenMP waits for this process and the ones it starts (unless the user chose)."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _busy_ticks() -> tuple[int, int] | None:
    """(all CPUs' busy ticks, this process's ticks), or None where /proc is missing."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])  # utime + stime


def others_load(window: float = 0.3) -> float | None:
    """CPU cores kept busy by other processes during ``window`` seconds (None: unknown)."""
    before = _busy_ticks()
    time.sleep(window)
    after = _busy_ticks()
    if before is None or after is None:
        return None
    ticks = (after[0] - before[0]) - (after[1] - before[1])
    return max(0, ticks) / os.sysconf("SC_CLK_TCK") / window


def choose_threads(requested: int, cores: int) -> int:
    """``requested`` if set (> 0), else every core, less one for the front end beyond two cores."""
    if requested > 0:
        return requested
    return cores if cores <= 2 else cores - 1


def busy_warning(busy: float | None, cores: int, threads: int) -> str | None:
    """What to tell a user whose machine is loaded (None when it is not)."""
    if busy is None or busy < BUSY_WARNING:
        return None
    return (f"other processes keep {busy:.1f} of {cores} CPU cores busy: the engine runs {threads} torch "
            f"thread{'s' if threads != 1 else ''}, and its steps will be slower and noisier than on a quiet machine")
