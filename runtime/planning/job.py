"""One simulation of a sweep or a search: what decides its metrics (``PointJob``), and its key.

The workload and the cost model are the same for every job of a run (``SharedInputs``); a job's
key is a digest of its own fields, of those two, and of the code that turns them into metrics, so
a cached result is reused only where it would come out the same.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import msgspec

from runtime.engine.config import EngineConfig
from runtime.planning.slo import Slo
from traces.workload import Workload

KEY_VERSION = 1
# the code a point's metrics come from: the engine core, the simulator, the log, the metrics, this package
CODE_DIRS = ("runtime/engine", "simulator", "traces", "analysis", "runtime/planning")


@dataclass(frozen=True)
class PointJob:
    config: EngineConfig
    replicas: int = 1
    router: str = "round-robin"
    rate_scale: float = 1.0
    step_scale: float = 1.0  # every step time the cost model predicts, multiplied by this
    slo: Slo | None = None
    # not part of the key: where to write the run's event log (on the worker), and the point's text
    # for the log's Header
    log: str | None = field(default=None, compare=False)
    label: str = field(default="", compare=False)

    def key_fields(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "replicas": self.replicas,
                "router": self.router if self.replicas > 1 else "",  # one replica: any router routes alike
                "rate_scale": self.rate_scale, "step_scale": self.step_scale,
                "slo": self.slo.text() if self.slo is not None else None}


@dataclass(frozen=True)
class SharedInputs:
    """The workload (sliced, before the rate scale of a job) and the cost model; ``cost_model_name``
    is how the re-run command and a log's Header name the model."""

    workload: Workload
    cost_model: Any
    cost_model_name: str = ""

    @cached_property
    def digest(self) -> str:
        h = hashlib.sha256()
        h.update(workload_digest(self.workload).encode())
        h.update(hashlib.sha256(pickle.dumps(self.cost_model, protocol=5)).hexdigest().encode())
        h.update(code_digest().encode())
        return h.hexdigest()


def workload_digest(workload: Workload) -> str:
    h = hashlib.sha256(f"{workload.seed}\n".encode())
    for r in workload.requests:
        h.update(msgspec.json.encode(r))
    return h.hexdigest()


@cache
def code_digest() -> str:
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for d in CODE_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def job_key(job: PointJob, inputs_digest: str) -> str:
    doc = {"version": KEY_VERSION, "inputs": inputs_digest, "job": job.key_fields()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
