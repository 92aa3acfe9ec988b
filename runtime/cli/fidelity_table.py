"""``minivllm fidelity-table --cost-model M --run ROLE:LOG --pair ROLE:ON_LOG:OFF_LOG``: one cost model
against several live runs, as one table (the fidelity tables of docs/BENCHMARKS.md).

``--run ROLE:LOG`` re-simulates LOG under its own config; ``--pair ROLE:ON_LOG:OFF_LOG`` re-simulates
ON_LOG's workload under OFF_LOG's config (the Headers' differences become ``--what-if`` overrides)
and checks it against OFF_LOG, signs of the differences included (two runs under other
arrivals, such as 80 and 110 % load: each simulated from its own log, the change compared). The model
is loaded afresh for each row (``fidelity`` adapts its overlap to the log). Prints the markdown tables.
``--sensitivity PCT`` adds, per run, each metric's elasticity to the step time and the step-time error
its error amounts to.
``--closed-loop ROLE:LOG:WORKLOAD`` re-simulates the closed-loop WORKLOAD that LOG's run replayed (turns
released by the simulation's own answers) under LOG's config. ``--repeat A_LOG:B_LOG`` (two live runs
of one config; repeatable) measures the run-to-run spread per metric (the largest over the repeats)
and counts, beside every sign, those of live differences beyond it.
The rows come from simulator/fidelity/fidelity_table.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime.cli import cost_models
from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError
from runtime.cli.workload import require_file


def _split(flag: str, spec: str, shape: str) -> list[str]:
    """``spec`` split as ``shape`` (``ROLE:LOG``, ``ROLE:ON_LOG:OFF_LOG``, ``A_LOG:B_LOG``), each log
    checked to exist; a log's path may hold a colon, the role not."""
    names = shape.split(":")
    with_role = names[0] == "ROLE"
    role, _, rest = spec.partition(":") if with_role else ("", "", spec)
    logs = rest.rsplit(":", len(names) - 1 - with_role)
    if (with_role and ":" not in spec) or len(logs) != len(names) - with_role or not all(logs):
        raise CLIError(f"{flag}: expected {shape}, got {spec!r}")
    for log in logs:
        require_file(log, "log")
    return [role, *logs] if with_role else logs


def _print_tables(rows: list[dict], spread: dict | None, sensitivity: float | None) -> None:
    from simulator.fidelity.fidelity_table import kind_table, markdown, sensitivity_table, sign_table, signs_beyond

    print(markdown(rows))
    if any(r["kind"] == "run" for r in rows):
        print("\ntiming replay: summed step time, predicted vs live, by kind of step\n")
        print(kind_table(rows))
    if sensitivity is not None:
        print("\nelasticity to the step time / the step-time error the run's error amounts to\n")
        print(sensitivity_table(rows))
    if spread is not None:
        print("\nrun-to-run spread of the live repeats (largest |b / a − 1|): "
              + ", ".join(f"{k} {v:.1f}%" for k, v in spread.items()))
    whatifs = [r for r in rows if r["kind"] == "what-if"]
    if whatifs:
        print("\npredicted / live change, on → off (✗: wrong sign)\n")
        print(sign_table(rows))
        if spread is not None:
            for r in whatifs:
                r["signs_beyond_spread"] = signs_beyond(r, spread)
            judged = [ok for r in whatifs for ok in r["signs_beyond_spread"].values()]
            every = [ok for r in whatifs for ok in r["signs"].values()]
            print(f"\nsigns right: {sum(judged)}/{len(judged)} of the live differences beyond the spread "
                  f"({sum(every)}/{len(every)} of all)")
    for r in rows:
        if r["kind"] == "what-if":
            changes = f"overrides {' '.join(r['overrides'])}" if r["overrides"] else "one config"
            print(f"{r['run']}: " + (changes if r["replayed"]
                                       else f"each run simulated from its own log ({changes})"))
        for note in r["notes"]:
            print(f"{r['run']}: note: {note}")


def _run(args: argparse.Namespace) -> int:
    from runtime.cli.fidelity import closed_loop_workload
    from simulator.fidelity.fidelity_table import pair_row, repeat_spread, run_row, short_names

    runs = [_split("--run", spec, "ROLE:LOG") for spec in args.run]
    closed = [_split("--closed-loop", spec, "ROLE:LOG:WORKLOAD") for spec in args.closed_loop]
    closed = [(role, log, closed_loop_workload(w, "--closed-loop")) for role, log, w in closed]
    pairs = [_split("--pair", spec, "ROLE:ON_LOG:OFF_LOG") for spec in args.pair]
    repeats = [_split("--repeat", spec, "A_LOG:B_LOG") for spec in args.repeat]
    if not runs and not pairs and not closed:
        raise CLIError("--run: give at least one --run ROLE:LOG, --pair ROLE:ON_LOG:OFF_LOG or --closed-loop "
                       "ROLE:LOG:WORKLOAD")
    cost_models.load(args.cost_model)  # a bad name is a flag error before any row is simulated
    names = short_names([log for _, log in runs] + [log for _, log, _ in closed]
                        + [log for _, on, off in pairs for log in (on, off)])
    rows = [run_row(log, cost_models.load(args.cost_model), role, args.sensitivity, names=names) for role, log in runs]
    rows += [run_row(log, cost_models.load(args.cost_model), role, args.sensitivity, workload, names)
             for role, log, workload in closed]
    rows += [pair_row(on, off, cost_models.load(args.cost_model), role, names) for role, on, off in pairs]
    spread = None
    if repeats:
        spreads = [repeat_spread(a, b) for a, b in repeats]
        spread = {k: max(s[k] for s in spreads) for k in spreads[0]}
    _print_tables(rows, spread, args.sensitivity)
    if args.json:
        doc = {"cost_model": args.cost_model, "rows": rows} | ({"repeat_spread": spread} if spread else {})
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fidelity-table", help="one cost model against several live runs (and on/off pairs): "
                       "the fidelity tables", description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--cost-model", required=True, metavar="M",
                   help="cost-model JSON, a shipped name (e.g. qwen3-0.6b-h200), or recorded:LOG")
    p.add_argument("--run", action="extend", nargs="+", default=[], metavar="ROLE:LOG",
                   help="re-simulate LOG under its own config; ROLE labels the row, e.g. fit or held-out "
                        "(one or more; repeatable)")
    p.add_argument("--pair", action="extend", nargs="+", default=[], metavar="ROLE:ON_LOG:OFF_LOG",
                   help="re-simulate ON_LOG's workload under OFF_LOG's config and check it against OFF_LOG, "
                        "or, for two runs under other arrivals (another load), each from its own log "
                        "(one or more; repeatable)")
    p.add_argument("--closed-loop", action="extend", nargs="+", default=[], metavar="ROLE:LOG:WORKLOAD",
                   help="simulate the closed-loop WORKLOAD that LOG's run replayed (bench serve of a workload "
                        "sessions file), its turns released by the simulation's own answers, under LOG's config "
                        "(one or more; repeatable)")
    p.add_argument("--sensitivity", type=float, metavar="PCT", action=Bounded, above=0, below=50,
                   help="per run, also re-simulate with every step PCT %% shorter and longer (elasticities) "
                        "(default: off)")
    p.add_argument("--repeat", action="extend", nargs="+", default=[], metavar="A_LOG:B_LOG",
                   help="two live runs of one config: their spread per metric (the largest over the repeats) "
                        "decides which on → off signs are judged (one or more; repeatable)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.set_defaults(func=_run)
