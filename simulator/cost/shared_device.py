"""What sharing a device with other replicas costs a step, as a fitted model keeps it.

Replicas placed on one device run their steps one after another (simulator/fleet/device.py); a step
that waits behind another replica's runs ``slowdown`` times as long as alone. The factor is fitted
from a co-located profile (``minivllm profile --co-located K``: K engines sweeping one device at
once; simulator/fitting/co_located.py) and kept in the model file beside its host timing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SharedDevice:
    slowdown: float  # a step behind another replica's work, against the same step alone
    replicas: int  # engines the profile ran on the device together
    steps: int  # their steps the fit replayed
    error_unshared_pct: float  # the co-located steps' total time, priced as if each engine were alone
    error_serial_pct: float  # ... one after another at the speed alone (slowdown 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> SharedDevice:
        shared = cls(**{k: doc[k] for k in cls.__dataclass_fields__})
        if not shared.slowdown > 0:
            raise ValueError(f"shared_device.slowdown must be > 0, got {shared.slowdown}")
        return shared
