"""Fit step-time model candidates and keep the one with the lowest held-out error.

Candidates (``CANDIDATES``):
  linear-relative   non-negative least squares on relative errors (the original fit): short and
                    long steps count alike, so it underpredicts long steps and the total time
  linear-absolute   non-negative least squares on durations: the residuals sum to ~0, so the total
                    step time of the training logs is preserved
  gbm               gradient-boosted regression trees (scikit-learn) on the extended features
  forest            a random forest on them (what Vidur uses)
  linear+gbm        linear-absolute plus boosted trees on its residual: the trees' corrections
                    inside the fitted shapes, the line's extrapolation outside them

Each is scored on the held-out steps by ``score = MAPE + |total-time error|`` (both in %): a
simulation needs steps right one by one (batches form from them) and in sum (latency and makespan
are sums of steps). ``auto`` keeps the best of those with a linear part (``EXTRAPOLATING``): trees
alone predict a constant past the shapes they were fitted on, and a what-if (chunking off, another
budget) is exactly a step outside them — on the CPU runs of docs/BENCHMARKS.md the boosted trees
had the lowest held-out step error and were 47-65 % off on the what-if. The tree-only ones are
still scored (and reported), and ``--kind`` fits one. Every tree fit is seeded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from simulator.cost.accuracy import mape
from simulator.cost.cost_model import CostModelError
from simulator.cost.features import FEATURES, PADDED
from simulator.cost.front_door_fit import fit_front_door
from simulator.cost.host_timing import fit_host_timing
from simulator.cost.launch import held_back_excess, launch_bound, launch_pairs, with_eager_launch
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.logged_run import LoggedRun, LogPath, read_runs
from simulator.cost.model_base import TimedModel
from simulator.cost.ranges import FeatureRanges
from simulator.cost.step_data import StepData
from simulator.cost.tree_model import TreeCostModel
from simulator.cost.trees import TreeEnsemble
from simulator.fitting.co_located import fit_shared_device
from simulator.fitting.intake import fit_intake_delay
from simulator.fitting.served_steps import fit_served_steps

CANDIDATES = ("linear-relative", "linear-absolute", "gbm", "forest", "linear+gbm")
EXTRAPOLATING = ("linear-relative", "linear-absolute", "linear+gbm")  # what auto may keep
SEED = 0
HOLDOUT_BLOCK = 32  # consecutive steps held out together (StepData.split)


def _gbm(n_estimators: int = 300):
    from sklearn.ensemble import GradientBoostingRegressor

    return GradientBoostingRegressor(loss="squared_error", n_estimators=n_estimators, max_depth=3,
                                     learning_rate=0.05, min_samples_leaf=3, random_state=SEED)


def _forest():
    from sklearn.ensemble import RandomForestRegressor

    return RandomForestRegressor(n_estimators=40, max_depth=10, min_samples_leaf=3, random_state=SEED, n_jobs=1)


def fit_candidate(name: str, train: StepData, meta: dict[str, Any] | None = None) -> TimedModel:
    """One candidate fitted on ``train`` (meta: identity, hardware, ... copied into the model)."""
    meta = dict(meta or {})
    y = train.durations
    keep = y > 0
    if not keep.any():
        raise CostModelError("no steps with a positive duration to fit")
    if name in ("linear-relative", "linear-absolute"):
        weighting = name.split("-")[1]
        model = LinearCostModel.fit(train, weighting=weighting, meta={**meta, "weighting": weighting})
    elif name in ("gbm", "forest", "linear+gbm"):
        data = train.subset(keep)
        ext, y = data.ext, data.durations
        # the trees never split on the padding: the line carries it (simulator/cost/padding_cost.py). Its
        # range follows the step budget (at most 511 at 2,048, up to 2,047 at 8,192): a split learned
        # at one budget would be a cliff at another
        X = ext.copy()
        X[:, PADDED] = 0
        coefficients = dict.fromkeys(FEATURES, 0.0)
        unfitted: list[str] = []
        if name == "linear+gbm":
            base = LinearCostModel.fit(data, weighting="absolute")
            coefficients, unfitted = base.coefficients, base.meta["unfitted_features"]
            y = y - base.predict(data.features)
        est = _forest() if name == "forest" else _gbm()
        est.fit(X, y)
        model = TreeCostModel(coefficients, TreeEnsemble.from_sklearn(est),
                              {**meta, "estimator": name, "unfitted_features": unfitted},
                              floor=float(data.durations.min()) / 2)
        pred = model.predict_ext(ext)
        model = model.with_meta(training={"logs": train.logs, "steps": int(len(y)), "mape": mape(pred, data.durations)})
    else:
        raise CostModelError(f"unknown cost-model candidate {name!r}; known: {', '.join(CANDIDATES)}")
    # its steps' longest_program was split so, and their prefill steps padded so
    return (model.with_meta(candidate=name).with_decode_splits(train.decode_splits)
            .with_step_padding(train.step_padding))


def evaluate(model: TimedModel, data: StepData) -> dict[str, Any]:
    return model.evaluate(data)


def score(ev: dict[str, Any]) -> float:
    return float(ev["mape"]) + abs(float(ev["total_error"]))


@dataclass
class Selection:
    best: str
    model: TimedModel
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # candidate -> mape, total_error, score


def select_model(train: StepData, held: StepData, candidates: tuple[str, ...] | list[str] = CANDIDATES,
                 meta: dict[str, Any] | None = None, keep: tuple[str, ...] | None = None) -> Selection:
    """Fit and score each candidate on ``train``; keep the lowest held-out score among ``keep``
    (default: all; ties: the earlier candidate)."""
    best: tuple[float, str, TimedModel] | None = None
    scores: dict[str, dict[str, float]] = {}
    for name in candidates:
        model = fit_candidate(name, train, meta)
        ev = evaluate(model, held)
        s = score(ev)
        scores[name] = {"mape": ev["mape"], "total_error": ev["total_error"], "score": s,
                        "training_mape": model.meta["training"]["mape"]}
        if keep is not None and name not in keep:
            continue
        if best is None or s < best[0] or (np.isnan(best[0]) and not np.isnan(s)):
            best = (s, name, model)
    assert best is not None, "no candidates"
    return Selection(best[1], best[2], scores)


def calibrate(model: TimedModel, logs: Sequence[LogPath | LoggedRun]) -> tuple[TimedModel, dict[str, Any]]:
    """``model`` scaled so its total step time on ``logs`` matches theirs: the shape of the step
    cost from a profile sweep, its level from live runs (another load on a shared CPU, the live
    engine's own overheads). Host timing then comes from ``logs`` too (and the eager launch, when
    the model has one: simulator/cost/launch.py); where their steps overlap (gaps show no intake), the
    intake delay is the one whose re-simulation of ``logs`` has their TTFT p50 (simulator/fitting/intake.py;
    logs whose TTFT is mostly queueing are left out, and with only those the delay stays the
    model's). Returns the calibrated model and what was done; each log is read once."""
    runs = read_runs(logs)
    data = StepData.from_logs(runs)
    # with a launch, the level from the steps whose logged time is their GPU time
    level = data.subset(~launch_pairs(data)) if model.launch_time is not None else data
    before = evaluate(model, level)
    factor = 1.0 / (1.0 + before["total_error"] / 100)
    scaled = model.scaled(factor)
    after = evaluate(scaled, level)
    host = fit_host_timing(runs)
    out = {"logs": [r.path for r in runs], "steps": int(len(level.durations)), "factor": factor,
           "mape_before": before["mape"], "mape_after": after["mape"], "total_error_before": before["total_error"]}
    if host.overlap and scaled.launch_time is not None:
        host, out["launch"] = with_eager_launch(host, data, scaled.predict_steps(data))
    delay = scaled.intake_delay
    calibrated = scaled.with_host(host)
    if host.overlap and host.fitted_from.get("requests"):
        fitted, out["intake"] = fit_intake_delay(calibrated, runs)
        # every log queue-bound: the delay stays the model's
        calibrated = fitted if out["intake"]["logs"] else calibrated.with_host(replace(host, intake_delay=delay))
    return calibrated, out


def decode_steps(logs: Sequence[LogPath | LoggedRun]) -> StepData:
    """The pure-decode steps of ``logs`` (no span with chunk > 1)."""
    data = StepData.from_logs(logs)
    return data.subset(data.features[:, FEATURES.index("prefill_tokens")] == 0)


def fit_cost_model(logs: Sequence[LogPath | LoggedRun], *, holdout: Sequence[LogPath] | None = None,
                   holdout_every: int = 5, holdout_block: int = HOLDOUT_BLOCK, kind: str = "auto",
                   meta: dict[str, Any] | None = None, calibrate_on: Sequence[LogPath] | None = None,
                   decode_steps_of: Sequence[LogPath] | None = None, eager_launch: bool | None = None,
                   weights: dict[str, int] | None = None, front_door: LogPath | None = None,
                   co_located: Sequence[LogPath | LoggedRun] = (), refit: bool = True) -> TimedModel:
    """The model for ``logs``: every candidate (``kind="auto"``) or one, fitted on the training
    steps; held-out error on ``holdout`` logs or every ``holdout_every``-th block of
    ``holdout_block`` steps, the candidate chosen by it then refitted on every step of ``logs``
    (``refit``; False keeps it as fitted without the held-out blocks, as the shipped H200 model was);
    host timing from the training logs' gaps; the ranges of the training steps. ``calibrate_on``:
    live logs that set the level of the step times (``calibrate``).
    ``decode_steps_of``: logs of which only the pure-decode steps join the training data (a
    profile whose prefill steps an engine change made stale, still covering large batches).
    ``eager_launch``: with overlapped logs, fit the host time to launch a step that carries prefill
    too (simulator/cost/launch.py): from the steps' times on the device where the logs carry them (a GPU
    profile sweep), the step model then learning those; else from the step model's predictions.
    None (the default): on exactly when every step carries its time on the device, since a logged
    duration there mixes the host's launch of the next step into the step's own time.
    ``weights``: a log of ``logs`` → how many times its training steps
    count (a profile sweep's few steps against many live ones); its held-out steps count once.
    ``front_door``: a front-door probe's log (runtime/bench/front_door_probe.py) the intake delay is
    fitted on (``fit_front_door``), in place of what the training logs' gaps say of it; the decode
    steps it streamed, if any, are set against the model (simulator/fitting/served_steps.py: a check
    in the model's meta, not applied).
    ``co_located``: a co-located profile's logs, what sharing a device costs a step
    (simulator/fitting/co_located.py). A log in several of these roles is read once."""
    cache: dict[str, LoggedRun] = {}  # each log read once, whatever roles it has in this fit
    runs = read_runs(logs, cache)
    data = StepData.from_logs(runs)
    if decode_steps_of:
        data = StepData.concat([data, decode_steps(read_runs(decode_steps_of, cache))])
    host = fit_host_timing(runs)
    if eager_launch is None:
        eager_launch = data.device_timed
    # with the launch modelled, steps timed on the device too (a GPU profile sweep) while the host
    # planned ahead: the step model learns the device's times, the launch is fitted from them
    timed = eager_launch and host.overlap and data.device_timed
    wall, data = data, data.on_device() if timed else data
    # with the launch modelled from logged times alone, the step model learns GPU times only: not
    # the steps it moves
    clean = eager_launch and host.overlap and not timed
    steps = data.subset(~launch_pairs(data)) if clean else data
    # timed on the device, a prefill step that ran as it was launched says nothing of its work
    bound = launch_bound(wall) if timed else None
    steps = steps.subset(~bound) if bound is not None else steps
    if holdout:
        held = StepData.from_logs(read_runs(holdout, cache))
        if timed and held.device_timed:  # judged as the training steps are
            held = held.subset(~launch_bound(held)).on_device()
        train, held = steps, held.subset(~launch_pairs(held)) if clean else held
    else:
        if holdout_every < 2:
            raise CostModelError(f"holdout_every must be >= 2, got {holdout_every}")
        train, held = steps.split(holdout_every, holdout_block)
    paths = [r.path for r in runs]

    def weighted(rows: StepData) -> StepData:
        return rows.weighted({paths.index(str(log)): times for log, times in weights.items()}) if weights else rows

    candidates = CANDIDATES if kind == "auto" else (kind,)
    selection = select_model(weighted(train), held, candidates, meta, keep=EXTRAPOLATING if kind == "auto" else None)
    # held out of the logs' own steps, whole blocks of a sweep's consecutive steps (whole shapes) were
    # left out of the training: they told which candidate extrapolates best, and the one chosen then
    # learns every step (a profile's fit without them priced conv steps 1-3 % apart, one split from another)
    refitted = refit and not holdout
    model = selection.model
    if refitted:  # (its ranges then those of every step too)
        train = steps
        model = fit_candidate(selection.best, weighted(train), meta)
    report: dict[str, Any] = {}  # the fit's report, into the model's metadata in this order
    if weights:
        report["training"] = {**model.meta["training"],
                              "weights": {str(log): times for log, times in weights.items()}}
    report["heldout"] = evaluate(selection.model, held)  # (of the candidate fitted without them)
    report["heldout"]["refitted"] = refitted  # the model saved learned them too
    if not holdout:
        block = max(1, min(holdout_block, len(steps.durations) // (4 * holdout_every)))
        report["heldout"]["kind"] = (f"every {holdout_every}th step of the training logs" if block == 1 else
                                     f"every {holdout_every}th block of {block} steps of the training logs")
    by = "held-out MAPE + |total-time error| (%)" + (", among " + ", ".join(EXTRAPOLATING) if kind == "auto" else "")
    report["selection"] = {"chosen": selection.best, "by": by, "candidates": selection.scores}
    if timed:
        report["device_timed"] = True
        report["launch_bound_prefills"] = int(bound.sum())
    if host.overlap:
        device = wall.device if timed else model.predict_steps(data)
        report["before_prefill"] = held_back_excess(wall, device)
        if eager_launch:
            host, launch = with_eager_launch(host, wall, device)
            if launch is not None:
                report["launch"] = launch
    if front_door:
        probe = read_runs([front_door], cache)[0]
        door = fit_front_door(probe.events)
        if door is None:
            raise CostModelError(f"{probe.path}: no request reached an idle engine: not a front-door probe's log")
        host = replace(host, intake_delay=door.intake_delay, intake_per_token=door.intake_per_token, wake=0.0)
        report["front_door"] = {"log": probe.path, **asdict(door)}
        if (served := fit_served_steps(probe, model)) is not None:
            report["served_steps"] = asdict(served)
    if co_located:
        members = read_runs(co_located, cache)
        model = model.with_shared_device(fit_shared_device(members, model))
        report["co_located"] = [m.path for m in members]
    model = model.with_meta(**report).with_host(host).with_ranges(FeatureRanges.from_ext(train.ext))
    if calibrate_on:
        model, calibration = calibrate(model, read_runs(calibrate_on, cache))
        model = model.with_meta(calibration=calibration)
    return model
