"""One cost model against several live runs: the fidelity table of docs/BENCHMARKS.md.

    python scripts/fidelity_table.py --cost-model qwen3-0.6b-h200 \\
        --run fit:serve_on_0.5.jsonl.gz --run held-out:serve_on_0.8.jsonl.gz \\
        --pair held-out:serve_on_0.8.jsonl.gz:serve_off_0.8.jsonl.gz --json table.json

``--run ROLE:LOG`` re-simulates LOG under its own config; ``--pair ROLE:ON_LOG:OFF_LOG`` re-simulates
ON_LOG's workload under OFF_LOG's config (the Headers' differences become ``--what-if`` overrides)
and checks it against OFF_LOG, signs of the differences included. The model is loaded afresh for
each row (``fidelity`` adapts its overlap to the log). Prints the markdown tables. ``--sensitivity PCT``
adds, per run, each metric's elasticity to the step time and the step-time error its error amounts to.
``--repeat A_LOG:B_LOG`` (two live runs of one config; repeatable) measures the run-to-run spread per
metric (the largest over the repeats) and counts, beside every sign, those of live differences beyond it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.cost_model import load_cost_model  # noqa: E402
from simulator.fidelity_table import (  # noqa: E402
    kind_table,
    markdown,
    pair_row,
    repeat_spread,
    run_row,
    sensitivity_table,
    sign_table,
    signs_beyond,
)


def _split(spec: str, parts: int) -> list[str]:
    role, _, rest = spec.partition(":")
    fields = rest.rsplit(":", parts - 2) if parts > 2 else [rest]
    if not rest or len(fields) != parts - 1:
        raise SystemExit(f"expected ROLE:{'LOG' if parts == 2 else 'ON_LOG:OFF_LOG'}, got {spec!r}")
    return [role, *fields]


def _two_logs(spec: str) -> tuple[str, str]:
    a, _, b = spec.rpartition(":")
    if not a or not b:
        raise SystemExit(f"--repeat: expected A_LOG:B_LOG, got {spec!r}")
    return a, b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cost-model", required=True, help="cost-model JSON or a shipped name")
    p.add_argument("--run", action="append", default=[], metavar="ROLE:LOG")
    p.add_argument("--pair", action="append", default=[], metavar="ROLE:ON_LOG:OFF_LOG")
    p.add_argument("--sensitivity", type=float, metavar="PCT",
                   help="per run, also re-simulate with every step PCT %% shorter and longer (elasticities)")
    p.add_argument("--repeat", action="append", default=[], metavar="A_LOG:B_LOG",
                   help="two live runs of one config: their spread per metric (the largest over the repeats) "
                        "decides which on → off signs are judged beside all of them")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    args = p.parse_args(argv)
    rows = []
    for spec in args.run:
        role, log = _split(spec, 2)
        rows.append(run_row(log, load_cost_model(args.cost_model), role, args.sensitivity))
    for spec in args.pair:
        role, on, off = _split(spec, 3)
        rows.append(pair_row(on, off, load_cost_model(args.cost_model), role))
    print(markdown(rows))
    if any(r["kind"] == "run" for r in rows):
        print("\ntiming replay: summed step time, predicted vs live, by kind of step\n")
        print(kind_table(rows))
    if args.sensitivity is not None:
        print("\nelasticity to the step time / the step-time error the run's error amounts to\n")
        print(sensitivity_table(rows))
    spread = None
    if args.repeat:
        spreads = [repeat_spread(*_two_logs(spec)) for spec in args.repeat]
        spread = {k: max(s[k] for s in spreads) for k in spreads[0]}
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
            print(f"{r['run']}: overrides {' '.join(r['overrides'])}")
        for note in r["notes"]:
            print(f"{r['run']}: note: {note}")
    if args.json:
        doc = {"cost_model": args.cost_model, "rows": rows} | ({"repeat_spread": spread} if spread else {})
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
