"""SLO searches per configuration of a grid, their probes run as jobs (cached, in parallel rounds).

``capacity``: the highest rate scale at which the configuration meets the SLO (``HighestPassing``
over the rate scale), ``replicas``: the fewest replicas that meet it at a given rate scale
(``FewestPassing``). Each is answered with the cost model as it is and, given a margin, with every
step that many % slower and faster (runtime/planning/margin.py). One row per configuration: the
answers, the SLO's metrics and goodput at the nominal answer, what broke the SLO just past it
(``limited_by``), and the nominal answer's point (``point``), which ``simulate`` re-runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import pandas as pd

from runtime.planning.bisection import FewestPassing, HighestPassing
from runtime.planning.cache import ResultCache
from runtime.planning.execute import execute
from runtime.planning.job import PointJob, SharedInputs
from runtime.planning.margin import FASTER, NOMINAL, SLOWER, step_scales
from runtime.planning.runner import Runner, RunStats
from runtime.planning.slo import Slo
from runtime.planning.sweep import Plan, Point, base_rate, point_columns

AT_ANSWER = ("goodput_req_s", "goodput_per_replica_req_s", "slo_attainment", "request_throughput_req_s",
             "output_throughput_tok_s")


@dataclasses.dataclass
class Searched:
    table: pd.DataFrame
    stats: RunStats
    simulations: int = 0
    cached: int = 0
    answers: list[Point | None] = dataclasses.field(default_factory=list)  # per row: the nominal answer's point


def with_change(point: Point, *, rate_scale: float | None = None, replicas: int | None = None) -> Point:
    settings = point.settings
    if replicas is not None:
        settings = tuple((n, v) for n, v in settings if n != "replicas") + (("replicas", replicas),)
    return dataclasses.replace(point, settings=settings,
                               rate_scale=point.rate_scale if rate_scale is None else rate_scale,
                               replicas=point.replicas if replicas is None else replicas)


def _drive(searches: dict[Hashable, Any], job_of: Callable[[Hashable, Any], PointJob], inputs: SharedInputs,
           runner: Runner, cache: ResultCache, progress: Any) -> tuple[dict, dict, Searched]:
    """Round after round, every live search's next probe; (metrics by search and probe, errors by
    search, the runs' totals)."""
    seen: dict[Hashable, dict[Any, dict[str, Any]]] = {tag: {} for tag in searches}
    errors: dict[Hashable, str] = {}
    done = Searched(pd.DataFrame(), RunStats(slots=runner.slots))
    while True:
        probes = [(tag, x) for tag, s in searches.items() if tag not in errors and (x := s.next_probe()) is not None]
        if not probes:
            return seen, errors, done
        results = execute([job_of(tag, x) for tag, x in probes], inputs, runner, cache, progress)
        done.stats.merge(results.stats)
        done.simulations += len(set(results.keys)) - results.cached
        done.cached += results.cached
        for i, (tag, x) in enumerate(probes):
            metrics = results.metrics(i)
            if metrics is None:
                errors[tag] = f"at {x:g}: {results.error(i)}"
                continue
            seen[tag][x] = metrics
            searches[tag].record(x, bool(metrics["meets_slo"]))


def _at(metrics: dict[str, Any] | None, slo: Slo) -> dict[str, Any]:
    cols = [t.column for t in slo.terms] + list(AT_ANSWER)
    return {c: (metrics or {}).get(c, float("nan")) for c in cols}


def _config_columns(point: Point, rate: float) -> dict[str, Any]:
    cols = point_columns(point, rate)
    for c in ("point", "rate_scale", "offered_req_s"):
        cols.pop(c)
    return cols


def search_capacity(plan: Plan, inputs: SharedInputs, runner: Runner, cache: ResultCache, slo: Slo,
                    margin_pct: float = 0.0, start: float = 1.0, tolerance: float = 0.02, highest: float = 1024.0,
                    progress: Any = None) -> Searched:
    """Per configuration of ``plan`` (its rate scales aside), the highest rate scale meeting ``slo``."""
    configs = list(dict.fromkeys(with_change(p, rate_scale=1.0) for p in plan.points()))
    scales = step_scales(margin_pct)
    searches = {(i, v): HighestPassing(start=start, tolerance=tolerance, highest=highest)
                for i in range(len(configs)) for v in scales}

    def job(tag, x: float) -> PointJob:
        return with_change(configs[tag[0]], rate_scale=x).job(slo, scales[tag[1]])

    seen, errors, done = _drive(searches, job, inputs, runner, cache, progress)
    rate = base_rate(inputs)
    rows = []
    for i, point in enumerate(configs):
        nominal = searches[(i, NOMINAL)]
        row = {**_config_columns(point, rate), "slo": slo.text(), "margin_pct": margin_pct}
        for v, name in ((NOMINAL, "capacity"), (SLOWER, "capacity_if_slower"), (FASTER, "capacity_if_faster")):
            answer = searches[(i, v)].answer if v in scales else None
            row[f"{name}_rate_scale"] = float("nan") if answer is None else answer
            row[f"{name}_req_s"] = float("nan") if answer is None else answer * rate
        row["bounded"] = nominal.bounded
        row["monotone"] = nominal.monotone
        row["probes"] = len(nominal.probes)
        row.update(_at(seen[(i, NOMINAL)].get(nominal.answer), slo))
        above = seen[(i, NOMINAL)].get(nominal.failing)
        row["limited_by"] = above["slo_violations"] if above else ""
        answer = with_change(point, rate_scale=nominal.answer) if nominal.answer is not None else None
        done.answers.append(answer)
        row["point"] = answer.text if answer is not None else ""
        row["error"] = "; ".join(f"{v}: {errors[(i, v)]}" for v in scales if (i, v) in errors)
        rows.append(row)
    done.table = pd.DataFrame(rows)
    return done


def search_replicas(plan: Plan, inputs: SharedInputs, runner: Runner, cache: ResultCache, slo: Slo, rate_scale: float,
                    margin_pct: float = 0.0, most: int = 64, progress: Any = None) -> Searched:
    """Per configuration of ``plan`` (its replicas and rate scales aside), the fewest replicas that
    meet ``slo`` at ``rate_scale``."""
    configs = list(dict.fromkeys(with_change(p, rate_scale=rate_scale) for p in plan.points()))
    scales = step_scales(margin_pct)
    searches = {(i, v): FewestPassing(most=most) for i in range(len(configs)) for v in scales}

    def job(tag, n: int) -> PointJob:
        return with_change(configs[tag[0]], replicas=n).job(slo, scales[tag[1]])

    seen, errors, done = _drive(searches, job, inputs, runner, cache, progress)
    rate = base_rate(inputs)
    rows = []
    for i, point in enumerate(configs):
        nominal = searches[(i, NOMINAL)]
        row = _config_columns(point, rate)
        row.pop("replicas")
        row.update({"rate_scale": rate_scale, "offered_req_s": rate_scale * rate, "slo": slo.text(),
                    "margin_pct": margin_pct})
        for v, name in ((NOMINAL, "replicas_needed"), (SLOWER, "replicas_if_slower"), (FASTER, "replicas_if_faster")):
            answer = searches[(i, v)].answer if v in scales else None
            row[name] = pd.NA if answer is None else answer
        row["probes"] = len(nominal.probes)
        row.update(_at(seen[(i, NOMINAL)].get(nominal.answer), slo))
        below = seen[(i, NOMINAL)].get(nominal.failing)
        row["limited_by"] = below["slo_violations"] if below else ""
        answer = with_change(point, replicas=nominal.answer) if nominal.answer is not None else None
        done.answers.append(answer)
        row["point"] = answer.text if answer is not None else ""
        row["error"] = "; ".join(f"{v}: {errors[(i, v)]}" for v in scales if (i, v) in errors)
        rows.append(row)
    table = pd.DataFrame(rows)
    for name in ("replicas_needed", "replicas_if_slower", "replicas_if_faster"):
        table[name] = table[name].astype("Int64")
    done.table = table
    return done
