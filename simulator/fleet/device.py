"""Devices: what replicas placed on one GPU (or one CPU's cores) contend for.

A step's device work holds its device for the step's duration; the steps of the replicas placed on
one device run one after another, in the order they are launched, as two engines' CUDA work
time-slices one GPU (live, two replicas sharing an H200 ran their steps about twice as long as one
engine alone: docs/BENCHMARKS.md, "Fleets"). Work launched while another replica's is still on the
device runs ``slowdown`` times as long as alone: what switching between the engines costs, fitted
from a co-located profile (``minivllm profile --co-located K``: simulator/fitting/co_located.py).
A device is the SimPy notion of a resource of capacity one served first come first served, kept as
the time it is next free: a step's end is then known when it is launched, which the step loop's
executor contract needs (simulator/fleet/executor.py). By default every replica has a device of its
own (``place``), and a simulation is what it was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Device:
    index: int
    replicas: int = 1  # placed on it
    free_at: float = -math.inf

    @property
    def shared(self) -> bool:
        return self.replicas > 1

    def run(self, start: float, duration: float, slowdown: float = 1.0) -> float:
        """Device work of ``duration`` alone that can begin at ``start``, after what was launched on
        the device before it (``slowdown`` times as long when there is some): its end."""
        if start >= self.free_at:
            begin = start
        else:
            begin, duration = self.free_at, duration * slowdown
        self.free_at = end = begin + duration
        return end


def place(replicas: int, devices: int | None = None) -> list[int]:
    """Replica i on device i mod ``devices`` (None: one device each)."""
    if devices is not None and not 1 <= devices <= replicas:
        raise ValueError(f"devices must be 1 to {replicas} (the replicas), got {devices}")
    return [i % (devices or replicas) for i in range(replicas)]


def devices_for(placement: Sequence[int]) -> list[Device]:
    """One Device per replica by ``placement`` (replica -> device index): replicas with the same
    index share one object."""
    counts: dict[int, int] = {}
    for d in placement:
        counts[d] = counts.get(d, 0) + 1
    by_index = {d: Device(d, n) for d, n in counts.items()}
    return [by_index[d] for d in placement]


def placement_of(device_names: Sequence[str | None]) -> list[int] | None:
    """Replicas' device names as their logs' headers give them (``cuda:1``; ``cuda`` is ``cuda:0``)
    as device indices in order of first appearance; None when a log does not say."""
    if not device_names or any(name is None for name in device_names):
        return None
    normal = [name if name != "cuda" else "cuda:0" for name in device_names]
    index: dict[str, int] = {}
    return [index.setdefault(name, len(index)) for name in normal]
