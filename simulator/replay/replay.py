"""Replay modes over a recorded log.

- ``timing_replay(log, cost_model)``: the recorded decisions (same steps, same spans) re-timed by
  a cost model. Steps run back to back, but none starts before the requests in it arrived, and
  the engine time the log shows between steps (``start - max(previous end, arrivals)``) is kept:
  only step durations are predicted, and with a model's eager launch (simulator/cost/launch.py) as
  the simulation's executor applies it (simulator/fleet/executor.py). Reports per-step error and
  per-request TTFT/E2E error; with the log's own durations (RecordedCostModel) every error is zero.
- ``resimulate(log, cost_model, config)``: the log's workload through the live scheduler again
  (simulator.sim) — with the recorded durations it reproduces the recorded decisions. A
  speculative config draws its drafts and acceptances from the log's own rates, per request
  (simulator/fleet/speculation.py), unless given others.

A speculative log's verify spans (a decode and its drafts, ``Step.drafts``) are spans of 1 + d
tokens to the cost model; the timing replay counts the steps that verify drafts and carry no
prefill chunk as a kind of their own.

Execute-replay (the recorded plans on a real executor) is in ``simulator.replay.execute``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from runtime.engine.config import EngineConfig
from runtime.engine.drafters import parse_speculative
from simulator.cost.accuracy import mape, total_error
from simulator.cost.cost_model import CostModel
from simulator.cost.logged_run import LoggedRun
from simulator.cost.model_base import for_step_budget
from simulator.cost.ranges import track_ranges
from simulator.sim import SimResult, Speculation, simulate
from traces.events import Arrived, Event, Finished, Header, Step
from traces.importers.log import log_workload, read_log_workload
from traces.log import LogError, read_log
from traces.speculation import verifying


@dataclass
class TimingReplay:
    steps: pd.DataFrame  # step, recorded, predicted (durations), rec_start, rec_end, pred_start, pred_end
    requests: pd.DataFrame  # request_id, ttft_rec, ttft_pred, e2e_rec, e2e_pred
    summary: dict[str, Any] = field(default_factory=dict)


def timing_replay(events_or_path: str | Path | list[Event], cost_model: CostModel) -> TimingReplay:
    events = list(read_log(events_or_path) if isinstance(events_or_path, str | Path) else events_or_path)
    launched = _launches(events)
    arrival: dict[int, float] = {}
    first_step: dict[int, int] = {}  # request -> index of the step that sampled its first token
    last_step: dict[int, int] = {}  # request -> index of the last step that sampled for it
    finish: dict[int, float] = {}
    cols: dict[str, list] = {k: [] for k in ("step", "recorded", "predicted", "rec_start", "rec_end",
                                             "pred_start", "pred_end", "prefill", "verify")}
    prev_rec = prev_pred = prev_device = prev_start = -math.inf
    tracker = step_time = launch_time = None  # (set by the Header: the model for the log's step budget)
    for i, ev in enumerate(events):
        if isinstance(ev, Step):
            if step_time is None:
                raise LogError("a log must start with a Header event")
            ready = max((arrival.get(s.request_id, -math.inf) for s in ev.spans), default=-math.inf)
            rec_ready = max(prev_rec, ready)
            gap = max(ev.start - rec_ready, 0.0)  # engine time outside the step, as recorded
            pred_start = max(prev_pred, ready) + gap
            verify = verifying(ev)
            # prev_device: where the step before's work ended, earlier than prev_pred when a launch held
            # it (the eager launch: simulator/cost/launch.py, applied as simulator/fleet/executor.py does)
            pred = step_time(ev.step, ev.spans, verify)
            if prev_pred > prev_device and gap == 0.0:  # this step, launched as the held one began, ran
                # on the device from that one's end
                prev_device = max(prev_device, prev_start, ready) + pred
                pred = max(prev_device - pred_start, 0.0)
            else:
                prev_device = pred_start + pred
            if launch_time is not None:
                if ev.start != prev_rec:  # launched as it began (an idle engine's): done no sooner
                    pred = max(pred, launch_time(ev.extra_tokens))
                    prev_device = max(prev_device, pred_start + pred)
                if i in launched:  # held until the next step's launch ends (its work follows this one's)
                    pred = max(pred, launch_time(launched[i]))
            pred_end = pred_start + pred
            k = len(cols["step"])
            for s in ev.spans:
                if s.sample:
                    first_step.setdefault(s.request_id, k)
                    last_step[s.request_id] = k
            for name, value in (("step", ev.step), ("recorded", ev.end - ev.start), ("predicted", pred),
                                ("rec_start", ev.start), ("rec_end", ev.end), ("pred_start", pred_start),
                                ("pred_end", pred_end),
                                ("prefill", any(s.num_tokens > 1 and s.request_id not in verify for s in ev.spans)),
                                ("verify", bool(verify))):
                cols[name].append(value)
            prev_rec, prev_pred, prev_start = ev.end, pred_end, pred_start
        elif isinstance(ev, Arrived):
            arrival[ev.request_id] = ev.time
        elif isinstance(ev, Finished):
            finish[ev.request_id] = ev.time
        elif isinstance(ev, Header):
            # the log's prefill steps padded to its own step budget's counts
            timed = for_step_budget(cost_model, ev.config["scheduler"]["max_num_batched_tokens"])
            tracker = track_ranges(timed)  # how many steps lie outside the model's fitted shapes
            step_time = (tracker or timed).step_time
            launch_time = cost_model.timing(ev.config["scheduler"]["max_num_batched_tokens"]).launch_time
    if step_time is None:
        raise LogError("a log must start with a Header event")
    steps = pd.DataFrame(cols)
    rec_end = np.asarray(cols["rec_end"], dtype=float)
    pred_end = np.asarray(cols["pred_end"], dtype=float)
    rows = []
    for rid, t0 in arrival.items():
        f = first_step.get(rid)
        row = {"request_id": rid, "ttft_rec": math.nan, "ttft_pred": math.nan,
               "e2e_rec": math.nan, "e2e_pred": math.nan}
        if f is not None:
            row["ttft_rec"] = rec_end[f] - t0
            row["ttft_pred"] = pred_end[f] - t0
        if rid in finish and rid in last_step:
            k = last_step[rid]
            row["e2e_rec"] = finish[rid] - t0
            # a finish outside a step (stop string) lags its last step by engine time: keep the lag
            row["e2e_pred"] = pred_end[k] + (finish[rid] - rec_end[k]) - t0
        rows.append(row)
    requests = pd.DataFrame(rows, columns=["request_id", "ttft_rec", "ttft_pred", "e2e_rec", "e2e_pred"])
    summary = _summary(steps, requests)
    if tracker is not None:
        summary["outside_model_range"] = tracker.report.to_dict()
        summary["range_warning"] = tracker.warning()
    return TimingReplay(steps, requests, summary)


def _launches(events: list[Event]) -> dict[int, int]:
    """Event index of each step whose next step tiles it (an overlapped engine's) and carries prefill:
    the extra tokens (beyond one per span) that next step's launch handles while this one runs."""
    out: dict[int, int] = {}
    before: tuple[int, Step] | None = None
    for i, ev in enumerate(events):
        if isinstance(ev, Step):
            extra = ev.extra_tokens
            if before is not None and before[1].end == ev.start and extra > 0:
                out[before[0]] = extra
            before = (i, ev)
    return out


def _errors(pred: pd.Series, rec: pd.Series) -> dict[str, float]:
    ok = pred.notna() & rec.notna()
    p, r = pred[ok].to_numpy(float), rec[ok].to_numpy(float)
    if not len(p):
        return {"n": 0, "mae_s": math.nan, "max_abs_s": math.nan, "mape": math.nan, "p90_ape": math.nan}
    err = np.abs(p - r)
    pos = r > 0
    ape = err[pos] / r[pos] * 100 if pos.any() else np.array([math.nan])
    return {"n": int(len(p)), "mae_s": float(err.mean()), "max_abs_s": float(err.max()),
            "mape": float(ape.mean()), "p90_ape": float(np.percentile(ape, 90))}


def _summary(steps: pd.DataFrame, requests: pd.DataFrame) -> dict[str, Any]:
    rec = steps["recorded"].to_numpy(float)
    pred = steps["predicted"].to_numpy(float)
    span = lambda start, end: float(end.iloc[-1] - start.iloc[0]) if len(steps) else 0.0
    return {
        "steps": int(len(steps)),
        "step_mape": mape(pred, rec),
        "step_time_recorded_s": float(rec.sum()),
        "step_time_predicted_s": float(pred.sum()),
        "makespan_recorded_s": span(steps["rec_start"], steps["rec_end"]),
        "makespan_predicted_s": span(steps["pred_start"], steps["pred_end"]),
        "ttft": _errors(requests["ttft_pred"], requests["ttft_rec"]),
        "e2e": _errors(requests["e2e_pred"], requests["e2e_rec"]),
        "by_kind": _by_kind(steps, pred, rec),
    }


def _by_kind(steps: pd.DataFrame, pred: np.ndarray, rec: np.ndarray) -> dict[str, dict[str, Any]]:
    prefill, verify = steps["prefill"].to_numpy(bool), steps["verify"].to_numpy(bool)
    kinds = [("decode", ~prefill & ~verify), ("prefill", prefill)]
    if verify.any():  # (a speculative log's: decodes verifying drafts, no prefill chunk)
        kinds.append(("verify", verify & ~prefill))
    return {kind: _kind_errors(pred[mask], rec[mask]) for kind, mask in kinds}


def _kind_errors(pred: np.ndarray, rec: np.ndarray) -> dict[str, Any]:
    """One kind of step's summed time, recorded and predicted: a machine whose decode steps run
    slower than the model's while its prefill steps run faster shows here, not in the total."""
    return {"steps": int(len(rec)), "recorded_s": float(rec.sum()), "predicted_s": float(pred.sum()),
            "error_pct": total_error(pred, rec), "mape": mape(pred, rec)}


def render_by_kind(by_kind: dict[str, dict[str, Any]]) -> str:
    """``by_kind`` of a timing replay's summary, one line."""
    names = {"decode": "decode-only steps", "prefill": "steps with prefill",
             "verify": "steps verifying drafts (no prefill)"}
    parts = [f"{names[k]} ({v['steps']:,}): total {v['error_pct']:+.1f}%, MAPE {v['mape']:.1f}%"
             for k, v in by_kind.items() if v["steps"]]
    return "by kind of step: " + "; ".join(parts)


def render_timing_replay(report: TimingReplay) -> str:
    s = report.summary
    lines = [
        f"steps: {s['steps']:,}   per-step MAPE: {s['step_mape']:.2f}%",
        f"total step time: recorded {s['step_time_recorded_s']:.3f} s, predicted {s['step_time_predicted_s']:.3f} s",
        f"makespan: recorded {s['makespan_recorded_s']:.3f} s, predicted {s['makespan_predicted_s']:.3f} s",
    ]
    for key in ("ttft", "e2e"):
        e = s[key]
        if not e["n"]:
            why = "none reached its first token" if key == "ttft" else "none finished"
            lines.append(f"{key.upper():>4} error: no request to compare ({why})")
            continue
        lines.append(f"{key.upper():>4} error over {e['n']:,} requests: mean abs {e['mae_s'] * 1e3:.3f} ms, "
                     f"max abs {e['max_abs_s'] * 1e3:.3f} ms, MAPE {e['mape']:.2f}%, p90 APE {e['p90_ape']:.2f}%")
    lines.append(render_by_kind(s["by_kind"]))
    if s.get("range_warning"):
        lines.append(s["range_warning"])
    return "\n".join(lines)


def log_config(path: str | Path) -> tuple[Header, EngineConfig]:
    """The header of a log and the engine config it recorded."""
    from traces.log import read_header

    header = read_header(path)
    return header, header_config(header, path)


def header_config(header: Header, path: str | Path) -> EngineConfig:
    """The engine config a log's header recorded."""
    try:
        return EngineConfig.from_dict(header.config)
    except (TypeError, ValueError) as e:
        raise LogError(f"{path}:1: the Header's config is not an engine config: {e}") from None


def resimulate(log: str | Path | LoggedRun, cost_model: CostModel, config: EngineConfig | None = None, *,
               sink=None, token_fn=None, progress=None, speculation: Speculation | None = None) -> SimResult:
    """Simulate the workload of a recorded log (a path, or a log already read: a fit that
    re-simulates it many times) under ``config`` (default: the log's own); a speculative config
    draws its rounds from ``speculation`` (default: the log's own rates)."""
    path = log.path if isinstance(log, LoggedRun) else log
    if config is None:
        config = header_config(log.header, path) if isinstance(log, LoggedRun) else log_config(path)[1]
    if speculation is None and parse_speculative(config.speculative) is not None:
        speculation = own_speculation([path], config.seed)
    if isinstance(log, LoggedRun):
        run = log
        workload = log_workload(run.events, path, lambda: run.dropped_bytes)
    else:
        workload = read_log_workload(path)
    return simulate(workload, config, cost_model, sink=sink, token_fn=token_fn,
                    progress=progress, header_extra={"resimulated_from": str(path)}, speculation=speculation)


def own_speculation(paths: list[str | Path], seed: int) -> Speculation:
    """A speculative log's own rates, per request: what its re-simulation draws from. ValueError
    (``--acceptance``: ...) when the log recorded no speculative round (a what-if that turns
    speculation on must say what to draw from)."""
    try:
        return Speculation.from_logs(paths, per_request=True, seed=seed)
    except ValueError as e:
        raise ValueError(f"--acceptance: {e}; give --acceptance LOG (a speculative log) or RATE") from None


def recorded_tokens(path: str | Path):
    """A simulator token function returning the tokens a log recorded: ``(request, position) -> id``
    (a re-simulation with them makes the recorded run's token-dependent decisions)."""
    from traces.events import Step
    from traces.log import read_log
    from traces.speculation import span_drafts

    table: dict[tuple[int, int], int] = {}
    for ev in read_log(path):
        if isinstance(ev, Step):
            sampling = [(s, d) for s, d in zip(ev.spans, span_drafts(ev)) if s.sample]
            for (span, drafts), tokens in zip(sampling, ev.tokens):
                first = span.start + span.num_tokens - len(drafts)  # a verify span's first draft's position
                for i, tok in enumerate(tokens):
                    table[span.request_id, first + i] = tok
    return lambda request_id, position: table[request_id, position]
