"""``minivllm cost-model {fit,eval,analytic}``: step-time models from logs.

fit: every candidate (simulator/fitting/fit.py: linear on relative or absolute errors, boosted trees, a
random forest, linear + boosted residual) is fitted on the Step events of LOG...; each one's error
is measured on ``--holdout`` logs, or, without them, on every 5th step held out of the fit; the
lowest held-out MAPE + |total-time error| among those with a linear part is kept (``--kind``
forces one). The model also gets
the host timing of the logs' gaps and the ranges of the fitted steps.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from runtime.cli import cost_models
from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError
from runtime.cli.workload import require_file

if TYPE_CHECKING:
    from simulator.cost.logged_run import LoggedRun

# simulator.fitting.fit's candidates, listed here so `--help` does not import scikit-learn
CANDIDATES = ("linear-relative", "linear-absolute", "gbm", "forest", "linear+gbm")


def fit_logs(logs: Sequence[str | LoggedRun], *, holdout: list[str] | None = None, holdout_every: int = 5,
             holdout_block: int = 32, kind: str = "auto", weighting: str | None = None,
             model_identity: str | None = None, hardware: str | None = None, dtype: str | None = None,
             command: str | None = None, calibrate_on: list[str] | None = None,
             decode_steps_of: list[str] | None = None, eager_launch: bool | None = None,
             weights: dict[str, int] | None = None, front_door: str | None = None,
             co_located: Sequence[str | LoggedRun] | None = None, refit: bool = True):
    """Fit a cost model on ``logs`` (paths, or logs already read: simulator.cost.logged_run;
    simulator.fitting.fit.fit_cost_model); its error on ``holdout`` logs, or on every
    ``holdout_every``-th step held out of the fit, goes to ``meta["heldout"]``. ``weighting``
    (relative | absolute) is the older way to ask for one linear fit. ``co_located``: the logs of a
    co-located profile (engines sweeping one device together): what sharing a device costs a step
    (simulator/fitting/co_located.py)."""
    from simulator.cost.cost_model import CostModelError
    from simulator.cost.logged_run import read_runs
    from simulator.fitting.fit import fit_cost_model

    if weighting is not None:
        kind = f"linear-{weighting}"
    runs = read_runs(logs)  # read once: the first one's header here, every one's steps and gaps in the fit
    header = runs[0].header
    extra = header.extra
    meta = {
        "provenance": "fit",
        "model_identity": model_identity or header.model_identity,
        "hardware": hardware or extra.get("hardware") or extra.get("device") or "unknown",
        "dtype": dtype or extra.get("dtype") or "unknown",
        "fit_date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if command:
        meta["command"] = command
    if not holdout and holdout_every < 2:
        raise CLIError(f"--holdout-every: must be >= 2, got {holdout_every}")
    try:
        return fit_cost_model(runs, holdout=holdout, holdout_every=holdout_every, holdout_block=holdout_block,
                              kind=kind, meta=meta, calibrate_on=calibrate_on, decode_steps_of=decode_steps_of,
                              eager_launch=eager_launch, weights=weights, front_door=front_door,
                              co_located=co_located or (), refit=refit)
    except CostModelError as e:
        raise CLIError(str(e)) from None


def print_fit(model, out: str) -> None:
    from simulator.fitting.fit import EXTRAPOLATING

    t, h = model.meta["training"], model.meta["heldout"]
    selection = model.meta.get("selection", {})
    if len(selection.get("candidates", {})) > 1:
        print(f"{'candidate':<16} {'held-out MAPE':>14} {'total time':>11} {'score':>8}")
        for name, c in selection["candidates"].items():
            mark = "  ← kept" if name == selection["chosen"] else ("" if name in EXTRAPOLATING else
                                                                    "  (trees alone: not kept by auto)")
            print(f"{name:<16} {c['mape']:>13.2f}% {c['total_error']:>+10.2f}% {c['score']:>8.2f}{mark}")
    print(f"{model.meta.get('candidate', 'linear')}: fitted on {t['steps']:,} steps: training MAPE {t['mape']:.2f}%, "
          f"held-out MAPE {h['mape']:.2f}%, total time {h.get('total_error', float('nan')):+.2f}% "
          f"({h['steps']:,} steps" + (", then refitted with them)" if h.get("refitted") else ")"))
    for name, value in model.coefficients.items():
        print(f"  {name:<18} {value:.4g}")
    host = getattr(model, "host", None)
    if host is not None:
        drafts = f" + {host.gap_per_draft * 1e6:.2f} µs/draft" if host.gap_per_draft else ""
        print(f"  host: gap {host.gap_const * 1e3:.3f} ms + {host.gap_per_seq * 1e6:.2f} µs/seq{drafts}, wake "
              f"{host.wake * 1e3:.3f} ms, intake delay {host.intake_delay * 1e3:.3f} ms"
              + (f" + {host.intake_per_token * 1e9:.1f} ns/prompt token" if host.intake_per_token else "")
              + (", steps overlap" if host.overlap else ""))
        if door := model.meta.get("front_door"):
            print(f"  front door: {door['requests']} probe requests reaching an idle engine, prompts to "
                  f"{door['max_prompt']:,} tokens, median delay {door['median_delay'] * 1e3:.2f} ms ({door['log']})"
                  + (f"; left out, every request of them stalled: {', '.join(f'{n:,}' for n in left)}-token prompts"
                     if (left := door.get("left_out")) else ""))
        if model.launch_time is not None:
            print(f"  eager launch: {host.eager_launch * 1e3:.3f} ms + {host.eager_launch_per_token * 1e6:.3f} µs per "
                  "token beyond one per span (holds back the step before)"
                  + (f"; {bound:,} prefill steps that ran as launched left out of the step model"
                     if (bound := model.meta.get("launch_bound_prefills")) else ""))
        elif (held := model.meta.get("before_prefill")) and held["excess_s"] - held["others_excess_s"] > 0.5e-3:
            print(f"  note: the {held['steps']:,} steps followed by a prefill step are logged "
                  f"{(held['excess_s'] - held['others_excess_s']) * 1e3:.2f} ms longer than the others, beyond the "
                  "model: the host launching that step holds them back (--eager-launch models it)")
    if served := model.meta.get("served_steps"):
        print(f"  served steps: × {served['factor']:.3f} the model's price (the front-door probe's {served['steps']} "
              f"streamed decode steps; 10th-90th percentile {served['p10']:.3f}-{served['p90']:.3f}; a check, "
              "not applied)")
    if (shared := getattr(model, "shared_device", None)) is not None:
        print(f"  shared device: a step behind another engine's work runs × {shared.slowdown:.3f} ({shared.replicas} "
              f"engines swept it together, {shared.steps:,} steps; priced each alone: "
              f"{shared.error_unshared_pct:+.1f}%, one after another at the speed alone: "
              f"{shared.error_serial_pct:+.1f}%)")
    print_calibration(model.meta.get("calibration"))
    if model.meta["unfitted_features"]:
        print(f"warning: no training step exercised {', '.join(model.meta['unfitted_features'])}: "
              "their coefficients are 0")
    print(f"wrote {out}")


def print_calibration(cal: dict | None) -> None:
    if not cal:
        return
    print(f"  calibrated on {cal['steps']:,} live steps: × {cal['factor']:.4f} (their total step time was "
          f"{cal['total_error_before']:+.2f}%; MAPE {cal['mape_before']:.1f}% → {cal['mape_after']:.1f}%)")
    i = cal.get("intake")
    if i and i["logs"]:
        print(f"  intake delay by re-simulation: {i['intake_delay_s'] * 1e3:.2f} ms (live TTFT p50 "
              + ", ".join(f"{t * 1e3:.1f}" for t in i["live_ttft_p50_s"]) + " ms; simulated "
              + ", ".join(f"{t * 1e3:.1f}" for t in i["sim_ttft_p50_s_after"]) + " ms)")
    if i and i.get("left_out"):
        print(f"  intake delay not fitted on {len(i['left_out'])} log(s) whose TTFT p50 is mostly queueing"
              + ("" if i["logs"] else " (kept as it was)"))


def _weights(specs: list[str] | None, logs: list[str]) -> dict[str, int] | None:
    """``--weight LOG=N`` (repeatable) as {LOG: N}; LOG must be one of the fitted logs."""
    if not specs:
        return None
    out = {}
    for spec in specs:
        log, _, times = spec.rpartition("=")
        if log not in logs:
            raise CLIError(f"--weight {spec}: {log or spec!r} is not one of the logs being fitted")
        if not times.isdigit() or int(times) < 1:
            raise CLIError(f"--weight {spec}: the weight must be a whole number >= 1")
        out[log] = int(times)
    return out


def _fit(args: argparse.Namespace) -> int:
    for path in [*args.logs, *(args.holdout or []), *(args.calibrate or []), *(args.decode_steps_of or []),
                 *([args.front_door] if args.front_door else []), *(args.co_located or [])]:
        require_file(path, "log")
    weights = _weights(args.weight, args.logs)
    model = fit_logs(args.logs, holdout=args.holdout, holdout_every=args.holdout_every,
                     holdout_block=args.holdout_block, kind=args.kind, calibrate_on=args.calibrate,
                     decode_steps_of=args.decode_steps_of, eager_launch=args.eager_launch, weights=weights,
                     weighting=args.weighting, model_identity=args.model_identity, hardware=args.hardware,
                     dtype=args.dtype, front_door=args.front_door, co_located=args.co_located, refit=args.refit)
    model.save(args.out)
    print_fit(model, args.out)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from simulator.cost.step_data import StepData

    for path in args.logs:
        require_file(path, "log")
    model = cost_models.load(args.model, flag=None)  # a file or a shipped name, as simulate/replay take
    if not hasattr(model, "evaluate"):
        raise CLIError(f"{args.model}: not a fitted cost model")
    result = model.evaluate(StepData.from_logs(args.logs))
    for log, err in result.get("per_log", {}).items():
        print(f"{log}: MAPE {err:.2f}%")
    print(f"per-step MAPE over {result['steps']:,} steps: {result['mape']:.2f}%; total step time "
          f"{result['total_error']:+.2f}%")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from simulator.cost.logged_run import read_runs
    from simulator.cost.model_base import TimedModel
    from simulator.fitting.fit import calibrate

    for path in args.logs:
        require_file(path, "log")
    model = cost_models.load(args.model, flag=None)
    if not isinstance(model, TimedModel):
        raise CLIError(f"{args.model}: not a fitted cost model (only a fitted model's level can be calibrated)")
    try:
        runs = read_runs(args.logs)  # read once for the calibration and the front door's fit
        model, cal = calibrate(model, runs)
    except (ValueError, RuntimeError) as e:  # CostModelError, a log that can't be re-simulated
        raise CLIError(str(e)) from None
    if args.door_service:
        from simulator.fitting.intake import fit_intake_service

        model, cal["door"] = fit_intake_service(model, runs)
        if cal["door"]:
            print(f"front door: service time {cal['door']['service_s'] * 1e3:g} ms (TTFT p90 error by candidate: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in cal["door"]["ttft_p90_abs_relative_error"].items()) + ")")
    model = model.with_meta(calibration=cal, calibrated_from=str(args.model))
    model.save(args.out)
    _warn_mismatch(model, args.logs, cal["factor"])
    print(f"{args.model}, host timing from {len(args.logs)} live log(s): intake delay "
          f"{model.host.intake_delay * 1e3:.2f} ms" + (", steps overlap" if model.host.overlap else ""))
    print_calibration(cal)
    print(f"wrote {args.out}")
    return 0


def _warn_mismatch(model, logs: list[str], factor: float) -> None:
    """A calibration is for another machine of the same kind, not another model or device."""
    from traces.log import read_header

    identity = model.meta.get("model_identity")
    for log in logs:
        logged = read_header(log).model_identity
        if identity and logged and logged != identity:
            print(f"warning: {log} ran {logged}, the cost model is for {identity}", file=sys.stderr)
    if not 0.5 <= factor <= 2:
        print(f"warning: the live steps take {factor:.2f}× the model's: another model, device or dtype? "
              "(machines of one kind differ by a few %)", file=sys.stderr)


def _analytic(args: argparse.Namespace) -> int:
    from simulator.cost.roofline import PRESETS, analytic_cost_model

    if args.preset not in PRESETS:
        raise CLIError(f"unknown preset {args.preset!r}; known: {', '.join(PRESETS)}")
    shape, hw = PRESETS[args.preset]
    kwargs = {} if args.step_overhead is None else {"step_overhead": args.step_overhead}
    analytic_cost_model(shape, hw, **kwargs).save(args.out)
    print(f"wrote {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cost-model", help="fit, evaluate or derive a step-time cost model")
    kinds = p.add_subparsers(dest="cost_model_command", required=True, metavar="ACTION")

    f = kinds.add_parser("fit", help="least-squares fit from the Step events of logs")
    f.add_argument("logs", nargs="+", metavar="LOG", help="event logs to fit on (live or profiled)")
    f.add_argument("--out", required=True, metavar="M.json", help="cost-model JSON to write")
    f.add_argument("--holdout", nargs="+", metavar="LOG", help="logs to measure the error on (not fitted; "
                   "default: every --holdout-every-th step of LOG)")
    f.add_argument("--holdout-every", type=int, default=5, action=Bounded, at_least=2,
                   help="without --holdout: hold out every Nth step, N >= 2 (default: %(default)s)")
    f.add_argument("--holdout-block", type=int, default=32, action=Bounded, at_least=1,
                   help="without --holdout: hold out blocks of N consecutive steps (neighbouring steps are near "
                        "copies; 1 = single steps) (default: %(default)s)")
    f.add_argument("--calibrate", nargs="+", metavar="LIVE_LOG",
                   help="live logs that set the level: the fitted model is scaled so its total step time on them "
                        "matches, and its host timing comes from them (default: none)")
    f.add_argument("--decode-steps-of", nargs="+", metavar="LOG",
                   help="logs of which only the pure-decode steps join the fit (e.g. a profile sweep whose prefill "
                        "steps an engine change made stale, still covering the large batches) (default: none)")
    f.add_argument("--eager-launch", action=argparse.BooleanOptionalAction, default=None,
                   help="with overlapped logs: also fit the host time to launch a step that carries prefill, which "
                        "holds back the step before it; the step model then learns the steps' times on the device "
                        "where the logs carry them, else leaves out the steps a launch moves "
                        "(simulator/cost/launch.py) (default: on for logs whose every step carries its time on the "
                        "device, a GPU profile sweep; off for others)")
    f.add_argument("--refit", action=argparse.BooleanOptionalAction, default=True,
                   help="fit the candidate the held-out blocks chose on every step, those blocks too: a sweep's "
                        "blocks are whole shapes (--no-refit keeps it as fitted without them, as the shipped models "
                        "were; with --holdout logs the fit has every step anyway) (default: %(default)s)")
    f.add_argument("--front-door", metavar="LOG",
                   help="a front-door probe's log (what `minivllm profile` writes beside its sweep): the intake delay "
                        "(arrival stamp to the engine's first step, by prompt length) is fitted on it (default: "
                        "from the fitted logs' gaps)")
    f.add_argument("--co-located", nargs="+", metavar="LOG",
                   help="the logs of a co-located profile (`minivllm profile --co-located K` writes them beside its "
                        "sweep): how much longer a step runs behind another engine's work on a shared device, for "
                        "simulations of replicas placed on one device")
    f.add_argument("--weight", action="append", metavar="LOG=N",
                   help="count the training steps of LOG (one of the fitted logs) N times: a profile sweep's few "
                        "steps of every shape against many live ones; its held-out steps count once (repeatable) "
                        "(default: every step once)")
    f.add_argument("--kind", choices=["auto", *CANDIDATES], default="auto",
                   help="the model to fit; auto: every candidate scored, the lowest held-out MAPE + |total-time "
                        "error| among those with a linear part kept (trees alone cannot extrapolate to "
                        "a what-if's larger steps) (default: %(default)s)")
    f.add_argument("--weighting", choices=["relative", "absolute"],
                   help="a linear fit on relative or absolute step-time errors (= --kind linear-WEIGHTING)")
    f.add_argument("--model-identity", help="model the fit is for (default: the first log's Header)")
    f.add_argument("--hardware", help="hardware the fit is for (default: the first log's Header "
                   "extra.hardware/device)")
    f.add_argument("--dtype", help="dtype the fit is for (default: the first log's Header extra.dtype)")
    f.set_defaults(func=_fit)

    e = kinds.add_parser("eval", help="per-step MAPE of a model on logs")
    e.add_argument("model", metavar="M", help="cost-model JSON or a shipped name (e.g. qwen3-0.6b-h200)")
    e.add_argument("logs", nargs="+", metavar="LOG", help="event logs whose step times to predict")
    e.set_defaults(func=_eval)

    c = kinds.add_parser("calibrate", help="a fitted model brought to this machine by live runs of it",
                         description="Scales a fitted model so its total step time on LIVE_LOG... matches theirs, "
                                     "and takes its host timing and front-door delay from them: the shape of the "
                                     "step cost stays the fit's, the level is this machine's (machines of one kind "
                                     "differ by up to 1.6 %%, which moves TPOT and E2E by 2-4 %%).")
    c.add_argument("model", metavar="M", help="cost-model JSON or a shipped name (e.g. qwen3-0.6b-h200)")
    c.add_argument("logs", nargs="+", metavar="LIVE_LOG", help="logs of live runs on the target machine")
    c.add_argument("--out", required=True, metavar="M.json", help="calibrated cost-model JSON to write")
    c.add_argument("--door-service", action="store_true",
                   help="also fit the front door as a queue: the service time (0-2 ms) whose re-simulation of the "
                        "logs has their TTFT p90, the intake delay refitted for each (slower: a re-simulation each)")
    c.set_defaults(func=_calibrate)

    a = kinds.add_parser("analytic", help="roofline model for a preset (model shape × hardware)")
    a.add_argument("preset", help="e.g. qwen3-0.6b-h200")
    a.add_argument("--out", required=True, metavar="M.json", help="cost-model JSON to write")
    a.add_argument("--step-overhead", type=float, action=Bounded, at_least=0,
                   help="fixed seconds per step (default: the preset's)")
    a.set_defaults(func=_analytic)
