"""Wait for other processes to leave the CPU before a measured case (Linux; elsewhere a no-op).

On a shared CPU the engine's OpenMP threads stall at every barrier while another process holds a
core: steps measured then are 10-30× slower than their shape explains (45 ms decode steps were
logged at 1.2 s), which no cost model should learn. Load from other processes is what /proc/stat
counts as busy minus what /proc/self/stat counts for this process, over a short window.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


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


def wait_until_quiet(max_wait: float, threshold: float = 0.25) -> float:
    """Sleep until other processes use < ``threshold`` cores, at most ``max_wait`` seconds;
    returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < max_wait:
        load = others_load()
        if load is None or load < threshold:
            break
    return time.monotonic() - start
