"""One simulation of a sweep or a search: what decides its metrics (``PointJob``), and its key.

The workload, the cost model and the acceptance rates are the same for every job of a run
(``SharedInputs``); a job's key is a digest of its own fields, of those inputs, and of the code
that turns them into metrics, so a cached result is reused only where it would come out the same.
The shared rates count only for a job that draws from them (it speculates and sets no constant
rate of its own): a point that doesn't speculate keeps its key whatever the rates.
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
from runtime.engine.drafters import parse_speculative
from runtime.planning.slo import Slo
from simulator.fleet.speculation import Speculation
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
    acceptance: float | None = None  # a constant per-token acceptance rate, over the shared rates
    # not part of the key: where to write the run's event log (on the worker), and the point's text
    # for the log's Header
    log: str | None = field(default=None, compare=False)
    label: str = field(default="", compare=False)

    def key_fields(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "replicas": self.replicas,
                "router": self.router if self.replicas > 1 else "",  # one replica: any router routes alike
                "rate_scale": self.rate_scale, "step_scale": self.step_scale,
                "slo": self.slo.text() if self.slo is not None else None,
                "acceptance": self.acceptance if self.speculates else None}  # no drafts: any rate alike

    @property
    def speculates(self) -> bool:
        return parse_speculative(self.config.speculative) is not None

    @property
    def draws_shared_rates(self) -> bool:
        return self.speculates and self.acceptance is None


@dataclass(frozen=True)
class SharedInputs:
    """The workload (sliced, before the rate scale of a job), the cost model and the rates a
    speculative job draws its drafts and acceptances from (None: no job needs them);
    ``cost_model_name`` is how the re-run command and a log's Header name the model."""

    workload: Workload
    cost_model: Any
    cost_model_name: str = ""
    speculation: Speculation | None = None

    @cached_property
    def digest(self) -> str:
        """Of every input (what a worker knows its copy by)."""
        return _join(self._common_digest, self._rates_digest)

    @cached_property
    def _common_digest(self) -> str:
        """Of the inputs every job's metrics come from: the workload, the cost model, the code."""
        return _join(workload_digest(self.workload), _pickled(self.cost_model), code_digest())

    @cached_property
    def _rates_digest(self) -> str:
        return self.speculation.fingerprint() if self.speculation is not None else "no rates"

    def key(self, job: PointJob) -> str:
        """``job``'s cache key: of the inputs its metrics come from."""
        return job_key(job, self.digest if job.draws_shared_rates else self._common_digest)


def _join(*digests: str) -> str:
    h = hashlib.sha256()
    for d in digests:
        h.update(d.encode())
    return h.hexdigest()


def _pickled(obj: Any) -> str:
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).hexdigest()


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
