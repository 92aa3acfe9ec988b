"""``minivllm fidelity LIVE_LOG --cost-model M``: how close the simulator comes to a live run.

Re-simulates the live log's workload under the log's own config with the cost model and prints
sim vs live per metric (TTFT, TPOT, ITL, E2E, queue) and statistic (mean, p50, p90, p99) with the
signed relative error, the makespan and step counts, and the timing-replay's per-step MAPE; writes
a CDF plot per metric and, with ``--json``, the report for CI. ``--tolerance PCT`` exits 1 when
TTFT, TPOT or E2E at p50/p90, or the makespan, is off by more. ``--what-if FIELD=VALUE`` (e.g.
``scheduler.enable_chunked_prefill=false``) re-simulates under the changed config too and prints
the predicted difference; ``--what-if-live LOG`` (the live run of that config) checks it;
``--draws N`` measures the change over N redrawings of the log's arrivals as well (a short run's
percentiles rest on a few requests).
``--sensitivity PCT`` re-simulates with every step PCT % shorter and longer and prints how far each
checked latency moves per 1 % of step time, and so how close the step model must be for the
tolerance. ``--by-arrival N`` splits the requests by arrival time into N windows and prints TTFT
and queueing per window, live and simulated: where in the run a tail comes from. A speculative
log is re-simulated with its own acceptance rates, per request; ``--acceptance LOG|RATE`` replaces
them (e.g. ``--what-if speculative=ngram:4 --acceptance 0.7`` on a plain log). ``--closed-loop
WORKLOAD``: the run replayed that closed-loop workload (``bench serve`` of a ``workload sessions``
file): simulate it, its turns released by the simulation's own answers, instead of the log's arrivals.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from runtime.cli import cost_models
from runtime.cli.acceptance_flags import add_acceptance_args, speculation_from_args
from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError
from runtime.cli.workload import require_file

LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "queue": "queue", "prefill": "prefill"}
W = max(map(len, LABELS.values())) + 1  # the metric column, a space past its longest label


def _ms(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{v * 1e3:,.1f}"


def _pct(v: float) -> str:
    return "—" if not math.isfinite(v) else f"{v:+.1f}%"


def render(report: dict) -> str:
    lines = [f"{'metric':<{W}}{'stat':<6}{'live ms':>12}{'sim ms':>12}{'error':>9}"]
    for m, row in report["metrics"].items():
        if not row["n_live"] and not row["n_sim"]:
            continue
        for s in ("p50", "p90", "p99", "mean"):
            c = row[s]
            lines.append(f"{LABELS[m]:<{W}}{s:<6}{_ms(c['live']):>12}{_ms(c['sim']):>12}{_pct(c['error_pct']):>9}")
    ms, st = report["makespan"], report["steps"]
    lines.append(f"makespan: live {ms['live_s']:,.2f} s, sim {ms['sim_s']:,.2f} s ({_pct(ms['error_pct'])}); "
                 f"steps: live {st['live']:,}, sim {st['sim']:,} ({_pct(st['error_pct'])})")
    if "replay" in report:
        from simulator.replay.replay import render_by_kind

        r = report["replay"]
        lines.append(f"timing-replay (live decisions re-timed): per-step MAPE {r['step_mape']:.1f}%, total step time "
                     f"{_pct(r['step_time_error_pct'])}; {render_by_kind(r['by_kind'])}")
    rej = report["sim"].get("rejected")
    if rej:
        lines.append(f"rejected by the simulated engine: {rej:,} requests")
    if report.get("range", {}).get("warning"):
        lines.append(report["range"]["warning"])
    return "\n".join(lines)


def render_sensitivity(sens: dict | None, tolerance: float | None) -> str:
    if sens is None:
        return "sensitivity: the cost model cannot be scaled (recorded durations)"
    cells = [(f"{LABELS[m]} {p}", e) for m in ("ttft", "tpot", "e2e") for p, e in sens[m].items()]
    cells.append(("makespan", sens["makespan"]))
    lines = [f"sensitivity (every step ±{sens['step_change_pct']:g}%, re-simulated): % change per 1 % of step time: "
             + ", ".join(f"{name} {e:.2f}" for name, e in cells)]
    if tolerance is not None:
        need = [f"{name} {tolerance / abs(e):.2g}%" for name, e in cells if math.isfinite(e) and e]
        lines.append(f"for ±{tolerance:g}% the step times must be within: " + ", ".join(need))
    return "\n".join(lines)


def render_by_arrival(rows: list[dict]) -> str:
    """One row per arrival window, live and simulated side by side (analysis/text_table.py)."""
    from analysis.text_table import render_plain, table

    keys = (("ttft_p50", "TTFT p50"), ("ttft_p90", "TTFT p90"), ("queue_p90", "queue p90"))
    columns = ["<window (s)", "requests", *(f"{name}\n{run} ms" for _, name in keys for run in ("live", "sim"))]
    body = [(f"{r['from_s']:,.1f}–{r['to_s']:,.1f}", f"{r['live']['requests']:,}",
             *(_ms(r[run][k]) for k, _ in keys for run in ("live", "sim"))) for r in rows]
    return render_plain("by arrival time (s from the first): requests, TTFT and queueing per window, live and sim",
                        table(columns, body), width=120).rstrip("\n")


def render_what_if(w: dict) -> str:
    lines = [f"what-if {' '.join(w['overrides'])}: " + ("; ".join(w["config_changes"]) or "no config change")]
    if "live_config_changes" in w:
        lines.append("live runs differ in: " + ("; ".join(w["live_config_changes"]) or "nothing"))
    has_live = "vs_live" in w
    draws = w.get("draws")
    head = f"{'metric':<{W}}{'stat':<6}{'predicted Δ':>12}"
    if draws:
        head += f"{str(draws['draws']) + ' draws Δ':>14}{'10–90 %':>17}"
    lines.append(head + (f"{'live Δ':>10}{'sign':>6}{'sim ms':>11}{'live ms':>11}{'error':>9}" if has_live else ""))
    for m, row in w["predicted_change"].items():
        for s in ("p50", "p90", "p99"):
            c = row[s]
            line = f"{LABELS[m]:<{W}}{s:<6}{_pct(c['predicted_pct']):>12}"
            if draws:
                d = draws["metrics"][m][s]
                line += f"{_pct(d['pooled_pct']):>14}{_pct(d['low_pct']) + ' … ' + _pct(d['high_pct']):>17}"
            if has_live:
                v = w["vs_live"][m][s]
                line += (f"{_pct(c['live_pct']):>10}{'ok' if c['same_sign'] else 'WRONG':>6}{_ms(v['sim']):>11}"
                         f"{_ms(v['live']):>11}{_pct(v['error_pct']):>9}")
            lines.append(line)
    if draws:
        lines.append(f"draws: the recorded requests, their arrivals redrawn {draws['draws']} times (Poisson at the "
                     "recorded mean rate), both configs simulated on each; Δ on the draws pooled, and the range of "
                     "the per-draw Δ")
    if has_live:
        ms = w["makespan"]
        lines.append(f"makespan: live {ms['live_s']:,.2f} s, sim {ms['sim_s']:,.2f} s ({_pct(ms['error_pct'])})")
    if w.get("range", {}).get("warning"):
        lines.append(w["range"]["warning"])
    return "\n".join(lines)


def plot_cdfs(dists: dict, path: Path, title: str) -> Path:
    """One panel per metric: the empirical CDF of each run (live solid, simulated dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    metrics = [m for m in LABELS if any(len(v[m]) for v in dists.values())]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.4), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for label, values in dists.items():
            v = np.sort(values[m]) * 1e3
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label, alpha=0.85,
                        linestyle="--" if label.startswith("sim") else "-", linewidth=1.4)
        ax.set_xlabel(f"{LABELS[m]} (ms)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def closed_loop_workload(path: str, flag: str):
    """The closed-loop workload at ``path`` (a ``workload sessions`` file); a CLI error names ``flag``."""
    from traces.formats import load_workload
    from traces.workload import WorkloadError

    require_file(path, "workload")
    try:
        workload = load_workload(path)
    except (WorkloadError, ValueError) as e:
        raise CLIError(f"{flag}: {e}") from None
    if not workload.closed_loop:
        raise CLIError(f"{flag}: {path} is not a closed-loop workload (minivllm workload sessions, --chain-sessions)")
    return workload


def _run(args: argparse.Namespace) -> int:
    from simulator.fidelity.fidelity import check, fidelity

    require_file(args.log, "log")
    if args.draws and not args.what_if:
        raise CLIError("--draws: needs --what-if FIELD=VALUE (the change to measure over the draws)")
    if args.what_if_live:
        require_file(args.what_if_live, "log")
        if not args.what_if:
            raise CLIError("--what-if-live: needs --what-if FIELD=VALUE (the config that log ran)")
    if args.devices is not None:  # (checked before the model loads and the simulation runs)
        from simulator.fleet.device import place
        from traces.fleet_log import FLEET_KEY, is_fleet
        from traces.log import read_header

        header = read_header(args.log)
        if not is_fleet(header):
            raise CLIError(f"--devices: {args.log} is not a fleet log (serve --data-parallel-size, "
                           "simulate --replicas)")
        try:
            place(int(header.extra[FLEET_KEY]["replicas"]), args.devices)
        except ValueError as e:
            raise CLIError(f"--devices: {e}") from None
    workload = None
    if args.closed_loop:
        from traces.fleet_log import is_fleet
        from traces.log import read_header

        if is_fleet(read_header(args.log)):
            raise CLIError(f"--closed-loop: {args.log} is a fleet log; a closed-loop workload is re-simulated on "
                           "one replica's log")
        workload = closed_loop_workload(args.closed_loop, "--closed-loop")
    model = cost_models.load(args.cost_model, log=args.log)
    speculation = None
    if args.acceptance is not None:
        from simulator.fidelity.config_diff import what_if
        from simulator.replay.replay import log_config

        _, config = log_config(args.log)
        try:
            configs = [config, what_if(config, args.what_if or [])]
        except ValueError as e:
            raise CLIError(str(e)) from None
        speculation = speculation_from_args(args, configs, None, config.seed)
    try:
        report, dists = fidelity(args.log, model, overrides=args.what_if or [], what_if_live=args.what_if_live,
                                 replay=not args.no_replay, sensitivity_pct=args.sensitivity,
                                 arrival_windows=args.by_arrival, speculation=speculation, devices=args.devices,
                                 workload=workload, draws=args.draws)
    except ValueError as e:
        if str(e).startswith(("--what-if", "--acceptance", "--draws")):
            raise CLIError(str(e)) from None
        raise
    report["cost_model"] = str(args.cost_model)
    ids = report["model_identity"]
    if ids["cost_model"] and ids["log"] and ids["cost_model"] != ids["log"]:
        print(f"warning: the cost model is for {ids['cost_model']}, the log ran {ids['log']}")
    print(f"fidelity of {args.cost_model} on {args.log}: {report['live']['requests']:,} requests re-simulated "
          "under the log's config")
    for note in report["notes"]:
        print(f"note: {note}")
    print(render(report))
    if "sensitivity" in report:
        print(render_sensitivity(report["sensitivity"], args.tolerance))
    if "by_arrival" in report:
        print(render_by_arrival(report["by_arrival"]))
    if "what_if" in report:
        print(render_what_if(report["what_if"]))
    stem = Path(args.log).name.split(".")[0]
    plot = Path(args.plot) if args.plot else Path(args.log).with_name(f"{stem}_fidelity.png")
    plot_cdfs(dists, plot, f"{Path(args.log).name}: live vs {Path(str(args.cost_model)).name}")
    print(f"CDF plot: {plot}")
    status = 0
    if args.tolerance is not None:
        bad = check(report, args.tolerance)
        report["tolerance"] = {"pct": args.tolerance, "exceeded": bad}
        if bad:
            print(f"beyond ±{args.tolerance:g}%: {', '.join(bad)}")
            status = 1
        else:
            print(f"within ±{args.tolerance:g}% (TTFT, TPOT, E2E at p50 and p90; makespan)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
        print(f"wrote {args.json}")
    return status


def _json_default(value):
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fidelity", help="re-simulate a live log with a cost model: sim vs live per metric",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("log", metavar="LIVE_LOG", help="event log of a live run (serve, bench live, generate)")
    p.add_argument("--cost-model", required=True, metavar="M",
                   help="cost-model JSON, a shipped name (e.g. smollm2-135m-cpu), or 'recorded'")
    p.add_argument("--what-if", action="append", metavar="FIELD=VALUE",
                   help="also re-simulate with this config change, e.g. scheduler.enable_chunked_prefill=false "
                        "(repeatable)")
    p.add_argument("--what-if-live", metavar="LOG", help="the live run of the --what-if config, to check the "
                   "predicted difference against")
    p.add_argument("--draws", type=int, metavar="N", action=Bounded, at_least=1, below=10001,
                   help="also measure the --what-if over N redrawings of the log's arrivals (Poisson at its mean "
                        "rate, the same requests): the change on the draws pooled and its per-draw range, "
                        "steadier than the one recorded draw (2N more simulations)")
    p.add_argument("--tolerance", type=float, metavar="PCT", action=Bounded, above=0,
                   help="exit 1 when TTFT/TPOT/E2E p50 or p90, or the makespan, is off by more (default: no check)")
    p.add_argument("--sensitivity", type=float, metavar="PCT", action=Bounded, above=0, below=50,
                   help="also re-simulate with every step PCT %% shorter and longer: how far each latency moves "
                        "per 1 %% of step time (two more simulations)")
    p.add_argument("--by-arrival", type=int, metavar="N", action=Bounded, at_least=1, below=1001,
                   help="also split the requests by arrival time into N equal windows: TTFT and queueing per "
                        "window, live and simulated (where in the run a tail comes from)")
    p.add_argument("--devices", type=int, metavar="M", action=Bounded, at_least=1,
                   help="a fleet log: its replicas on M devices, replica i on device i mod M (default: as the log "
                        "says: the device each replica's Header names, so replicas that shared a GPU share one)")
    p.add_argument("--closed-loop", metavar="WORKLOAD",
                   help="the closed-loop workload the run replayed (bench serve of a workload sessions file): "
                        "simulated, each turn released by the simulation's own answer, instead of the log's "
                        "arrivals")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    p.add_argument("--plot", metavar="PNG", help="CDF plot path (default: next to LIVE_LOG, *_fidelity.png)")
    p.add_argument("--no-replay", action="store_true", help="skip the timing-replay (per-step MAPE)")
    add_acceptance_args(p)
    p.set_defaults(func=_run)
