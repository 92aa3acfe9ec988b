"""Wait for other processes to leave the CPU before a measured case (Linux; elsewhere a no-op).

On a shared CPU the engine's OpenMP threads stall at every barrier while another process holds a
core: steps measured then are 10-30× slower than their shape explains (45 ms decode steps were
logged at 1.2 s), which no cost model should learn. Load from other processes is what /proc/stat
counts as busy minus what /proc/self/stat counts for this process, over a short window.
"""

from __future__ import annotations

import time

from runtime.executor.cpu_threads import others_load


def wait_until_quiet(max_wait: float, threshold: float = 0.25) -> float:
    """Sleep until other processes use < ``threshold`` cores, at most ``max_wait`` seconds;
    returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < max_wait:
        load = others_load()
        if load is None or load < threshold:
            break
    return time.monotonic() - start
