"""``minivllm cost-model {fit,eval,analytic}``: step-time models from logs.

fit: non-negative least squares over the Step events of LOG...; the error is measured on
``--holdout`` logs, or, without them, on every 5th step held out of the fit.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

from runtime.cli import cost_models
from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError
from runtime.cli.workload import require_file


def fit_logs(logs: list[str], *, holdout: list[str] | None = None, holdout_every: int = 5,
             weighting: str = "relative", model_identity: str | None = None, hardware: str | None = None,
             dtype: str | None = None, command: str | None = None):
    """Fit a LinearCostModel on ``logs``; its error on ``holdout`` logs, or on every
    ``holdout_every``-th step held out of the fit, goes to ``meta["heldout"]``."""
    from simulator.cost_model import LinearCostModel, StepData
    from traces.log import read_header

    header = read_header(logs[0])
    extra = header.extra
    meta = {
        "provenance": "fit",
        "model_identity": model_identity or header.model_identity,
        "hardware": hardware or extra.get("hardware") or extra.get("device") or "unknown",
        "dtype": dtype or extra.get("dtype") or "unknown",
        "fit_date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "weighting": weighting,
    }
    if command:
        meta["command"] = command
    data = StepData.from_logs(logs)
    if holdout:
        train, held = data, StepData.from_logs(holdout)
    else:
        if holdout_every < 2:
            raise CLIError(f"--holdout-every: must be >= 2, got {holdout_every}")
        train, held = data.split(holdout_every)
    model = LinearCostModel.fit(train, weighting=weighting, meta=meta)
    model.meta["heldout"] = model.evaluate(held)
    if not holdout:
        model.meta["heldout"]["kind"] = f"every {holdout_every}th step of the training logs"
    return model


def print_fit(model, out: str) -> None:
    t, h = model.meta["training"], model.meta["heldout"]
    print(f"fitted on {t['steps']:,} steps: training MAPE {t['mape']:.2f}%, held-out MAPE {h['mape']:.2f}% "
          f"({h['steps']:,} steps)")
    for name, value in model.coefficients.items():
        print(f"  {name:<18} {value:.4g}")
    if model.meta["unfitted_features"]:
        print(f"warning: no training step exercised {', '.join(model.meta['unfitted_features'])}: "
              "their coefficients are 0")
    print(f"wrote {out}")


def _fit(args: argparse.Namespace) -> int:
    for path in [*args.logs, *(args.holdout or [])]:
        require_file(path, "log")
    model = fit_logs(args.logs, holdout=args.holdout, holdout_every=args.holdout_every, weighting=args.weighting,
                     model_identity=args.model_identity, hardware=args.hardware, dtype=args.dtype)
    model.save(args.out)
    print_fit(model, args.out)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from simulator.cost_model import LinearCostModel, StepData

    for path in args.logs:
        require_file(path, "log")
    model = cost_models.load(args.model, flag=None)  # a file or a shipped name, as simulate/replay take
    if not isinstance(model, LinearCostModel):
        raise CLIError(f"{args.model}: not a fitted (linear) cost model")
    result = model.evaluate(StepData.from_logs(args.logs))
    for log, err in result.get("per_log", {}).items():
        print(f"{log}: MAPE {err:.2f}%")
    print(f"per-step MAPE over {result['steps']:,} steps: {result['mape']:.2f}%")
    return 0


def _analytic(args: argparse.Namespace) -> int:
    from simulator.roofline import PRESETS, analytic_cost_model

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
    f.add_argument("--weighting", choices=["relative", "absolute"], default="relative",
                   help="least squares on relative or absolute step-time errors (default: %(default)s)")
    f.add_argument("--model-identity", help="model the fit is for (default: the first log's Header)")
    f.add_argument("--hardware", help="hardware the fit is for (default: the first log's Header "
                   "extra.hardware/device)")
    f.add_argument("--dtype", help="dtype the fit is for (default: the first log's Header extra.dtype)")
    f.set_defaults(func=_fit)

    e = kinds.add_parser("eval", help="per-step MAPE of a model on logs")
    e.add_argument("model", metavar="M", help="cost-model JSON or a shipped name (e.g. qwen3-0.6b-h200)")
    e.add_argument("logs", nargs="+", metavar="LOG", help="event logs whose step times to predict")
    e.set_defaults(func=_eval)

    a = kinds.add_parser("analytic", help="roofline model for a preset (model shape × hardware)")
    a.add_argument("preset", help="e.g. qwen3-0.6b-h200")
    a.add_argument("--out", required=True, metavar="M.json", help="cost-model JSON to write")
    a.add_argument("--step-overhead", type=float, action=Bounded, at_least=0,
                   help="fixed seconds per step (default: the preset's)")
    a.set_defaults(func=_analytic)
