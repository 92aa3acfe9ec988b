"""A sweep: one simulation per grid point and load, as one table.

Each row carries the point's text (``point``: its settings and rate scale; ``config``: its settings
alone, the line a plot draws), every setting of the engine and fleet it ran (swept or not:
``speculative`` off or the drafter, ``acceptance`` its constant rate, NaN for a log's rates), the
offered load, the metrics (``runtime.planning.metrics_row``), ``status`` (ok | failed) with the
error of a failed point, and ``key`` (its cache key). Rows are in grid order, loads fastest, and
the same at any parallelism: nothing in them depends on where or when a point ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from runtime.engine.config import EngineConfig
from runtime.planning.cache import ResultCache
from runtime.planning.execute import Results, execute
from runtime.planning.grid import (
    Grid,
    Settings,
    acceptance_setting,
    engine_options,
    fleet_settings,
    number_text,
    settings_text,
)
from runtime.planning.job import PointJob, SharedInputs
from runtime.planning.runner import Runner
from runtime.planning.slo import Slo


@dataclass(frozen=True)
class Point:
    settings: Settings
    rate_scale: float
    config: EngineConfig
    replicas: int
    router: str
    acceptance: float | None = None  # the constant per-token acceptance rate (None: the shared rates)

    @property
    def config_text(self) -> str:
        return settings_text(self.settings)

    @property
    def text(self) -> str:
        settings = [settings_text(self.settings)] if self.settings else []
        return " ".join([*settings, f"rate_scale={number_text(self.rate_scale)}"])

    def job(self, slo: Slo | None, step_scale: float = 1.0, log: str | None = None) -> PointJob:
        return PointJob(self.config, self.replicas, self.router, self.rate_scale, step_scale, slo, self.acceptance,
                        log, self.text)


@dataclass(frozen=True)
class Plan:
    """``base``: the engine config before any option; ``options``: the engine options every point
    shares (the command line's), by dotted name; a point's own go over them in one
    ``EngineConfig.replace``, as ``simulate`` applies its flags. ``replicas``, ``router`` and
    ``acceptance`` (a constant per-token rate: ``--acceptance RATE``) are a point's where the grid
    doesn't set them."""

    grid: Grid
    rate_scales: tuple[float, ...]
    base: EngineConfig
    options: dict[str, Any]
    replicas: int = 1
    router: str = "round-robin"
    acceptance: float | None = None

    def config(self, settings: Settings) -> EngineConfig:
        return self.base.replace(**{**self.options, **engine_options(settings)})

    def points(self) -> list[Point]:
        out = []
        for settings in self.grid.points():
            config = self.config(settings)
            replicas, router = fleet_settings(settings, self.replicas, self.router)
            acceptance = acceptance_setting(settings, self.acceptance)
            out.extend(Point(settings, r, config, replicas, router, acceptance) for r in self.rate_scales)
        return out


def point_columns(p: Point, base_rate: float) -> dict[str, Any]:
    """The settings a point ran with, as table columns."""
    s, c = p.config.scheduler, p.config.cache
    return {"point": p.text, "config": p.config_text,
            "chunked": "on" if s.enable_chunked_prefill else "off", "budget": s.max_num_batched_tokens,
            "max_seqs": s.max_num_seqs, "block_size": c.block_size, "kv_blocks": c.num_blocks, "policy": s.policy,
            "prefix_caching": "on" if c.enable_prefix_caching else "off", "speculative": p.config.speculative or "off",
            "acceptance": float("nan") if p.acceptance is None else p.acceptance, "replicas": p.replicas,
            "router": p.router, "rate_scale": p.rate_scale, "offered_req_s": base_rate * p.rate_scale}


def base_rate(inputs: SharedInputs) -> float:
    """Requests per second of the workload's own arrivals (what ``bench matrix`` scales its loads by)."""
    wl = inputs.workload
    return len(wl) / wl.duration if wl.duration > 0 else float("nan")


def table(points: Sequence[Point], results: Results, rate: float) -> pd.DataFrame:
    rows = []
    for i, p in enumerate(points):
        metrics, error = results.metrics(i), results.error(i)
        rows.append({**point_columns(p, rate), **(metrics or {}), "status": "ok" if metrics is not None else "failed",
                     "error": error or "", "key": results.keys[i]})
    df = pd.DataFrame(rows)
    # a failed row's metrics are NaN; its columns go where the others' are
    tail = ["status", "error", "key"]
    return df[[c for c in df.columns if c not in tail] + tail]


def run_sweep(plan: Plan, inputs: SharedInputs, runner: Runner, cache: ResultCache, slo: Slo | None = None,
              log_dir: str | None = None, progress: Any = None) -> tuple[pd.DataFrame, Results]:
    """The table of every point of ``plan``; ``log_dir``: each simulated point's event log there
    (``point-<key prefix>.jsonl.gz``, written by its worker)."""
    points = plan.points()
    jobs = [p.job(slo) for p in points]
    if log_dir is not None:
        jobs = [p.job(slo, log=f"{log_dir}/point-{inputs.key(j)[:12]}.jsonl.gz")
                for p, j in zip(points, jobs)]
    results = execute(jobs, inputs, runner, cache, progress)
    return table(points, results, base_rate(inputs)), results
