"""One point simulated: the workload at the job's rate scale through its fleet, summarized in memory.

The replicas' events go to frame builders, not to files: what travels back is the metrics row. A
job with a ``log`` also writes the run's event log there, as ``minivllm simulate --out LOG`` would
(one replica: LOG; a fleet: LOG is the fleet log, the replicas' logs beside it), its Header naming
the point. A speculative job draws its drafts and acceptances from its own constant rate where it
sets one, else from the shared rates.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from analysis.frames import FrameBuilder, combine_replicas
from runtime.planning.job import PointJob
from runtime.planning.metrics_row import metrics_row
from simulator.cost.cost_model import CostModel, ScalableCostModel
from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
from simulator.fleet.speculation import Speculation
from traces.events import Routed, make_header
from traces.fleet_log import fleet_extra, replica_log_path
from traces.log import LogWriter
from traces.workload import Workload


def scaled_model(model: CostModel, step_scale: float) -> CostModel:
    """``model`` with every step time multiplied by ``step_scale`` (a new model; the model itself if 1)."""
    if step_scale == 1.0:
        return model
    if not isinstance(model, ScalableCostModel):
        raise ValueError(f"the cost model {type(model).__name__} can't scale its step times")
    return model.scaled(step_scale)


def _tee(*sinks):
    def sink(event) -> None:
        for s in sinks:
            s(event)
    return sink


def simulate_point(job: PointJob, workload: Workload, cost_model: CostModel, cost_model_name: str = "",
                   speculation: Speculation | None = None) -> dict[str, Any]:
    """The metrics row of ``job`` (``runtime.planning.metrics_row``); ``speculation``: the shared rates."""
    if job.acceptance is not None:
        speculation = Speculation.constant(job.acceptance, seed=job.config.seed)
    wl = workload.scale_rate(job.rate_scale) if job.rate_scale != 1.0 else workload
    model = scaled_model(cost_model, job.step_scale)
    builders = [FrameBuilder() for _ in range(job.replicas)]
    routes: list[Routed] = []
    extra = {"cost_model": cost_model_name, **({"point": job.label} if job.label else {})}
    with contextlib.ExitStack() as stack:
        sinks: list[Any] = list(builders)
        route_sink: Any = routes.append if job.replicas > 1 else None
        if job.log is not None:
            out = Path(job.log)
            out.parent.mkdir(parents=True, exist_ok=True)
            logs = [replica_log_path(out, i) for i in range(job.replicas)] if job.replicas > 1 else [out]
            writers = [stack.enter_context(LogWriter(p)) for p in logs]
            sinks = [_tee(b, w) for b, w in zip(builders, writers)]
            if job.replicas > 1:
                fleet_log = stack.enter_context(LogWriter(out))
                point = {"point": job.label} if job.label else {}
                fleet_log(make_header(job.config, clock="sim", extra={**fleet_extra(job.router, logs, out), **point}))
                route_sink = _tee(routes.append, fleet_log)
        simulate_fleet(wl, [ReplicaSpec(job.config, model, s) for s in sinks], job.router, route_sink=route_sink,
                       header_extra=extra, speculation=speculation)
    parts = [b.frames() for b in builders]
    frames = parts[0] if job.replicas == 1 else combine_replicas(parts[0].header, parts, routes)
    return metrics_row(frames, job.replicas, job.slo)
