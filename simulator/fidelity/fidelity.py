"""How close a simulation comes to a live run: re-simulate the live log's workload under its own
config and compare the latency distributions, the makespan and the steps.

``fidelity(live_log, model)`` returns a JSON-ready report:
  metrics     per metric (TTFT, TPOT, ITL, E2E, queue) and statistic (mean, p50, p90, p99): live,
              sim, and the signed relative error (sim - live) / live in %
  makespan    last step end - first arrival, live and sim; steps, live and sim
  replay      timing-replay of the live log with the model (the live decisions, re-timed): per-step
              MAPE and total step time — the model's own error, before re-scheduling amplifies it
  range       the share of simulated steps (and time) outside the model's fitted shapes
  what_if     with ``overrides`` (FIELD=VALUE): the re-simulation under the changed config, its
              predicted difference from the base simulation per metric and, given the live log of
              that config (``what_if_live``), the live difference, the signs, and the error against it;
              with ``draws``, the difference over that many redrawings of the arrivals (draws.py)

A speculative log is re-simulated with its own acceptance rates, per request; ``speculation``
(another log's or a constant rate) replaces them, e.g. for a what-if that turns speculation on.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from runtime.engine.config import EngineConfig
from runtime.engine.drafters import parse_speculative
from simulator.cost.cost_model import CostModel, ScalableCostModel
from simulator.cost.host_timing import log_overlaps
from simulator.cost.model_base import TimedModel
from simulator.cost.ranges import track_ranges
from simulator.fidelity.config_diff import config_changes, what_if
from simulator.fidelity.draws import what_if_over_draws
from simulator.fidelity.statistics import STATS, rel_error, stats
from simulator.fleet.device import place, placement_of
from simulator.fleet.fleet import ReplicaSpec, simulate_fleet
from simulator.fleet.outages import outages_of
from simulator.fleet.replica import SimResult
from simulator.fleet.speculation import Speculation
from simulator.replay.replay import log_config, own_speculation, resimulate, timing_replay
from simulator.replay.request_times import METRICS, RequestTimes, times_of_log
from simulator.sim import simulate
from traces.fleet_log import FLEET_KEY, FleetLog, is_fleet
from traces.importers.log import read_log_workload
from traces.log import read_header
from traces.workload import Workload

# what --tolerance checks: the fidelity goal's metrics (TTFT, TPOT, E2E at p50 and p90; makespan)
CHECKED = {"ttft": ("p50", "p90"), "tpot": ("p50", "p90"), "e2e": ("p50", "p90")}


def compare(live: dict[str, np.ndarray], sim: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for m in METRICS:
        a, b = stats(live[m]), stats(sim[m])
        out[m] = {"n_live": a["n"], "n_sim": b["n"],
                  **{s: {"live": a[s], "sim": b[s], "error_pct": rel_error(b[s], a[s])} for s in STATS}}
    return out


def simulate_times(log: str | Path, model: CostModel, config: EngineConfig, speculation: Speculation | None = None,
                   devices: int | None = None, workload: Workload | None = None) -> tuple[RequestTimes, Any, Any]:
    """Re-simulate ``log``'s workload under ``config``: the run's times, the SimResult, the range
    tracker. A fleet log's workload goes through a fleet of its replicas and its router, placed on
    devices as it ran (``fleet_placement``; ``devices``: on that many instead). A speculative
    config draws from ``speculation`` (default: the log's own rates). ``workload``: simulate that
    one instead of the log's arrivals (the closed-loop workload a run replayed: its turns released
    by the simulation's own answers)."""
    tracker = track_ranges(model)
    fleet = is_fleet(read_header(log))
    if workload is not None:
        if fleet:
            raise ValueError("a closed-loop workload is re-simulated on one replica's log, not a fleet log")
        times = RequestTimes()
        result = simulate(workload, config, tracker or model, sink=times)
        return times, result, tracker
    if fleet:
        return (*resimulate_fleet(log, tracker or model, config, speculation, devices), tracker)
    times = RequestTimes()
    result = resimulate(log, tracker or model, config, sink=times, speculation=speculation)
    return times, result, tracker


def fleet_placement(fleet: FleetLog, devices: int | None = None) -> list[int] | None:
    """The device of each of a fleet's replicas: ``devices`` of them (replica i on i mod devices),
    else as its log says (the fleet Header's ``devices``, or the device each replica's Header names:
    ``serve --data-parallel-size 2`` on one GPU puts both on cuda:0); None: one device each."""
    if devices is not None:
        return place(fleet.replicas, devices)
    recorded = fleet.header.extra.get(FLEET_KEY, {}).get("devices")
    if recorded is not None:
        return [int(d) for d in recorded]
    return placement_of([read_header(p).extra.get("device") for p in fleet.replica_logs[:fleet.replicas]])


def resimulate_fleet(log: str | Path, model: CostModel, config: EngineConfig, speculation: Speculation | None = None,
                     devices: int | None = None) -> tuple[RequestTimes, Any]:
    """A fleet log's requests (every replica's, by arrival) through as many simulated replicas and
    its router, on the devices they ran on (``fleet_placement``): each replica under its own logged
    config, or every one under ``config`` when that is not the fleet log's own (a what-if); a replica
    that went down live goes down at the same times."""
    fleet = FleetLog.read(log)
    first_logs = fleet.replica_logs[:fleet.replicas]  # (a replica started again has later logs too)
    placed = fleet_placement(fleet, devices) or [None] * len(first_logs)
    _, own = log_config(log)
    configs = [log_config(p)[1] if config == own else config for p in first_logs]
    workload = Workload([r for p in fleet.replica_logs for r in read_log_workload(p)], source=str(log))
    if speculation is None and any(parse_speculative(c.speculative) for c in configs):
        speculation = own_speculation(list(fleet.replica_logs), config.seed)
    parts = [RequestTimes() for _ in configs]

    def restarted(replica: int, restart: int) -> tuple[RequestTimes, None]:
        parts.append(RequestTimes())  # its request ids start afresh: times of their own
        return parts[-1], None

    results = simulate_fleet(workload, [ReplicaSpec(c, model, t, d) for c, t, d in zip(configs, parts, placed)],
                             fleet.router, speculation=speculation, outages=outages_of(fleet),
                             restart_sink=restarted)
    result = SimResult(sum(r.num_requests for r in results), sum(r.num_steps for r in results),
                       max(r.end_time for r in results), [x for r in results for x in r.rejected])
    return RequestTimes.merged(parts), result


def _run_summary(times: RequestTimes, result: Any = None) -> dict[str, Any]:
    out = {"requests": times.requests, "steps": times.steps, "makespan_s": times.makespan, "busy_s": times.busy}
    if result is not None:
        out["rejected"] = len(result.rejected)
    return out


def check(report: dict[str, Any], tolerance: float) -> list[str]:
    """The checked errors beyond ``tolerance`` (%), as lines; empty when all are within it."""
    bad = []
    for m, pcts in CHECKED.items():
        for p in pcts:
            e = report["metrics"][m][p]["error_pct"]
            if math.isfinite(e) and abs(e) > tolerance:
                bad.append(f"{m.upper()} {p}: {e:+.1f}%")
    e = report["makespan"]["error_pct"]
    if math.isfinite(e) and abs(e) > tolerance:
        bad.append(f"makespan: {e:+.1f}%")
    return bad


def sensitivity(live_log: str | Path, model: CostModel, config: EngineConfig, pct: float,
                speculation: Speculation | None = None, devices: int | None = None,
                workload: Workload | None = None) -> dict[str, Any] | None:
    """How far the checked latencies move per 1 % of step time: the workload re-simulated with every
    step ``pct`` % shorter and ``pct`` % longer, the elasticity d ln(metric) / d ln(step time) per
    metric and percentile (and the makespan). The arrivals stay fixed, so a longer step also means
    larger batches and longer queues: on a busy engine a 1 % step-time error moves TPOT and E2E by
    2-3 % and a tail TTFT near saturation by far more (docs/BENCHMARKS.md, "Simulator fidelity"). A goal of
    ±g % on a metric of elasticity e therefore needs the step model within g / e %. None when the
    model cannot be scaled (``recorded``)."""
    if not isinstance(model, ScalableCostModel):
        return None
    runs = []
    for factor in (1 - pct / 100, 1 + pct / 100):
        runs.append(simulate_times(live_log, model.scaled(factor), config, speculation, devices, workload)[0])
    span = math.log((1 + pct / 100) / (1 - pct / 100))

    def elasticity(lo: float, hi: float) -> float:
        return math.log(hi / lo) / span if lo > 0 and hi > 0 else math.nan

    faster, slower = (r.values() for r in runs)
    out: dict[str, Any] = {"step_change_pct": pct}
    for m, pcts in CHECKED.items():
        lo, hi = stats(faster[m]), stats(slower[m])
        out[m] = {p: elasticity(lo[p], hi[p]) for p in pcts}
    out["makespan"] = elasticity(runs[0].makespan, runs[1].makespan)
    return out


def by_arrival(live: RequestTimes, sim: RequestTimes, windows: int) -> list[dict[str, Any]]:
    """The requests split by arrival time into ``windows`` equal spans (from each run's first
    arrival): per span, their count and TTFT and queueing p50/p90, live and simulated. A tail
    percentile is often set by one stretch of a run (a queue that builds near its end): this says
    which stretch, and whether the simulation diverges before it."""
    runs = {}
    for label, times in (("live", live), ("sim", sim)):
        arrival, ttft, queue = times.by_request()
        runs[label] = (arrival - arrival[0] if len(arrival) else arrival, ttft, queue)
    span = max((float(a[-1]) for a, _, _ in runs.values() if len(a)), default=0.0)
    if span == 0:  # every request at once (an offline batch): one window
        windows = 1
    edges = np.linspace(0.0, span, windows + 1)
    rows = []
    for i in range(windows):
        row: dict[str, Any] = {"from_s": float(edges[i]), "to_s": float(edges[i + 1])}
        for label, (arrival, ttft, queue) in runs.items():
            inside = (arrival >= edges[i]) & ((arrival < edges[i + 1]) if i < windows - 1 else (arrival <= span))
            row[label] = {"requests": int(inside.sum())}
            for m, values in (("ttft", ttft[inside]), ("queue", queue[inside])):
                st = stats(values[np.isfinite(values)])
                row[label].update({f"{m}_p50": st["p50"], f"{m}_p90": st["p90"]})
        rows.append(row)
    return rows


def fidelity(live_log: str | Path, model: CostModel, *, config: EngineConfig | None = None, overrides: list[str] = (),
             what_if_live: str | Path | None = None, replay: bool = True,
             sensitivity_pct: float | None = None, arrival_windows: int | None = None,
             speculation: Speculation | None = None, devices: int | None = None, workload: Workload | None = None,
             draws: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(report, distributions): the JSON-ready report and, per run label, the raw metric values
    (for a CDF plot). ``sensitivity_pct``: also the latencies' elasticity to the step time
    (``sensitivity``); ``arrival_windows``: also TTFT and queueing by arrival time (``by_arrival``);
    ``speculation``: the rates speculative runs draw from (default: the log's own); ``devices``: a
    fleet log's replicas on that many devices (default: as the log says); ``workload``: the
    closed-loop workload the live run replayed, simulated in place of the log's arrivals
    (``simulate_times``); ``draws``: the what-if also over that many redrawings of the log's arrivals
    (simulator/fidelity/draws.py)."""
    header, log_cfg = log_config(live_log)
    config = config or log_cfg
    model, notes = _match_overlap(live_log, model)
    live = times_of_log(live_log)
    sim, result, tracker = simulate_times(live_log, model, config, speculation, devices, workload)
    live_v, sim_v = live.values(), sim.values()
    identity = getattr(model, "meta", {}).get("model_identity")
    report: dict[str, Any] = {
        "live_log": str(live_log),
        "model_identity": {"log": header.model_identity, "cost_model": identity},
        "config_changes": config_changes(log_cfg, config),
        "notes": notes,
        "live": _run_summary(live), "sim": _run_summary(sim, result),
        "metrics": compare(live_v, sim_v),
        "makespan": {"live_s": live.makespan, "sim_s": sim.makespan,
                     "error_pct": rel_error(sim.makespan, live.makespan)},
        "steps": {"live": live.steps, "sim": sim.steps, "error_pct": rel_error(sim.steps, live.steps)},
    }
    if tracker is not None:
        report["range"] = {**tracker.report.to_dict(), "warning": tracker.warning()}
    if replay and not is_fleet(header):  # (a fleet's replicas replay one by one: minivllm replay REPLICA_LOG)
        s = timing_replay(live_log, model).summary
        report["replay"] = {"step_mape": s["step_mape"], "step_time_recorded_s": s["step_time_recorded_s"],
                            "step_time_predicted_s": s["step_time_predicted_s"],
                            "step_time_error_pct": rel_error(s["step_time_predicted_s"], s["step_time_recorded_s"]),
                            "by_kind": s["by_kind"]}
    if sensitivity_pct is not None:
        report["sensitivity"] = sensitivity(live_log, model, config, sensitivity_pct, speculation, devices, workload)
    if arrival_windows is not None:
        report["by_arrival"] = by_arrival(live, sim, arrival_windows)
    dists = {"live": live_v, "sim": sim_v}
    if overrides:
        report["what_if"], extra = _what_if(live_log, model, config, list(overrides), sim_v, live_v, what_if_live,
                                            speculation, devices, workload)
        dists.update(extra)
        if draws:
            report["what_if"]["draws"] = _over_draws(live_log, header, model, config, list(overrides), draws,
                                                     speculation, workload)
    return report, dists


def _match_overlap(live_log: str | Path, model: CostModel) -> tuple[CostModel, list[str]]:
    """The model run the way the live engine ran: overlapped steps (async scheduling: the log's
    steps tile) or sequential ones, and a note when that is not how it was fitted. The header does
    not record it; the log shows it."""
    if not isinstance(model, TimedModel) or model.host is None:
        return model, []
    host = model.host
    if is_fleet(read_header(live_log)):  # a fleet log holds no steps: its first replica's log does
        live_log = FleetLog.read(live_log).replica_logs[0]
    overlaps = log_overlaps(live_log)
    if overlaps == host.overlap:
        return model, []
    return model.with_host(dataclasses.replace(host, overlap=overlaps)), [
        f"the live log's steps {'overlap' if overlaps else 'run one after another'}: simulated "
        f"{'with' if overlaps else 'without'} overlap (the model was fitted {'without' if overlaps else 'with'} it)"]


def _over_draws(live_log, header, model, config, overrides, draws, speculation, workload) -> dict[str, Any]:
    """``what_if_over_draws`` of the log's requests, under its config and the changed one."""
    if is_fleet(header):
        raise ValueError("--draws: a fleet log's arrivals are its replicas'; redraw one replica's log")
    if workload is not None:
        raise ValueError("--draws: a closed-loop workload's turns arrive when the previous answer has: "
                         "no arrivals to redraw")
    new = what_if(config, overrides)
    if speculation is None and any(parse_speculative(c.speculative) for c in (config, new)):
        speculation = own_speculation([live_log], config.seed)
    return what_if_over_draws(read_log_workload(live_log), model, config, new, draws, speculation)


def _what_if(live_log, model, config, overrides, sim_v, live_v, what_if_live, speculation=None, devices=None,
             workload=None):
    new = what_if(config, overrides)
    sim2, result2, tracker2 = simulate_times(live_log, model, new, speculation, devices, workload)
    sim2_v = sim2.values()
    out: dict[str, Any] = {"overrides": overrides, "config_changes": config_changes(config, new),
                           "sim": _run_summary(sim2, result2), "predicted_change": {}}
    if tracker2 is not None:
        out["range"] = {**tracker2.report.to_dict(), "warning": tracker2.warning()}
    base, changed = compare(sim_v, sim2_v), None
    dists = {"sim (what-if)": sim2_v}
    if what_if_live is not None:
        live2 = times_of_log(what_if_live)
        live2_v = live2.values()
        dists["live (what-if)"] = live2_v
        _, live2_cfg = log_config(what_if_live)
        _, live_cfg = log_config(live_log)
        changed = compare(live_v, live2_v)
        out["live_log"] = str(what_if_live)
        out["live_config_changes"] = config_changes(live_cfg, live2_cfg)
        out["live"] = _run_summary(live2)
        out["vs_live"] = compare(live2_v, sim2_v)
        out["makespan"] = {"live_s": live2.makespan, "sim_s": sim2.makespan,
                           "error_pct": rel_error(sim2.makespan, live2.makespan)}
    out["predicted_change"] = _changes(base, changed)
    return out, dists


def _changes(predicted: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """Per metric and statistic: the predicted change (``compare`` of the simulated runs), the live one
    where there is a live pair, and whether their signs agree."""
    out: dict[str, Any] = {}
    for m in METRICS:
        row = {}
        for s in STATS:
            cell = {"predicted_pct": predicted[m][s]["error_pct"]}
            if live is not None:
                actual = live[m][s]["error_pct"]
                cell["live_pct"] = actual
                p = cell["predicted_pct"]
                cell["same_sign"] = (math.isfinite(p) and math.isfinite(actual) and np.sign(p) == np.sign(actual))
            row[s] = cell
        out[m] = row
    return out


def arrivals_what_if(live_log: str | Path, other_log: str | Path, model: CostModel
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The what-if of other arrivals (another load, another trace slice; the config may differ
    too): each live run simulated from its own log under its own config. ``live_log``'s report,
    and the what-if's ``live_log``, ``sim``, ``live``, ``vs_live``, ``makespan`` and
    ``predicted_change`` as ``fidelity``'s ``what_if`` has them with ``what_if_live=other_log``;
    ``other_log``'s notes and range warning join the report's notes."""
    report, dists = fidelity(live_log, model, replay=False)
    other, other_dists = fidelity(other_log, model, replay=False)
    what_if = {"live_log": str(other_log), "vs_live": other["metrics"], "makespan": other["makespan"],
               "sim": other["sim"], "live": other["live"],
               "predicted_change": _changes(compare(dists["sim"], other_dists["sim"]),
                                            compare(dists["live"], other_dists["live"]))}
    warning = other.get("range", {}).get("warning")
    notes = other["notes"] + ([f"{Path(other_log).name}: {warning}"] if warning else [])
    report["notes"] = report["notes"] + [n for n in notes if n not in report["notes"]]
    return report, what_if
