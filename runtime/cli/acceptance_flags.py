"""``--acceptance LOG|RATE`` and ``--acceptance-per``: what a simulated speculative engine draws its
drafts and acceptances from (simulator/fleet/speculation.py; shared by ``simulate`` and ``fidelity``).

- ``--acceptance LOG``: a speculative log's rates (traces/acceptance.py): how often a decode got
  drafts, how many, and the per-position acceptance; per workload by default, ``--acceptance-per
  request`` when the simulated workload is that log's own requests;
- ``--acceptance RATE``: every decode drafts K tokens, each accepted with RATE after the ones before
  it (a what-if);
- neither: a speculative log simulated under a speculative config takes its own rates, per request.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.cli.errors import CLIError


def add_acceptance_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (with --speculative, or a speculative log's config)")
    g.add_argument("--acceptance", metavar="LOG|RATE",
                   help="where drafts and their acceptance are drawn from: a speculative log's rates, or a "
                        "constant per-token acceptance rate in [0, 1] (every decode drafting K tokens) "
                        "(default: the rates of WORKLOAD, when it is a speculative log)")
    g.add_argument("--acceptance-per", choices=["workload", "request"],
                   help="--acceptance LOG: one set of rates for the whole workload, or each request its own "
                        "(matched by arrival time and prompt length: for a workload of that log's own requests) "
                        "(default: request for a log's own rates, workload for another's)")


def _rate(text: str) -> float | None:
    """A rate (CLIError out of [0, 1]), or None: not a number (a log's path)."""
    from traces.acceptance import parse_rate

    try:
        float(text)
    except ValueError:
        return None
    try:
        return parse_rate(text)
    except ValueError as e:
        raise CLIError(f"--acceptance: {e}") from None


def _log_paths(path: str) -> list[str]:
    """A log's paths to read rates from: a fleet log's replica logs, else itself."""
    from traces.fleet_log import FleetLog, is_fleet
    from traces.log import read_header

    if is_fleet(read_header(path)):
        return [str(p) for p in FleetLog.read(path).replica_logs]
    return [path]


def is_speculative(config) -> bool:
    from runtime.engine.drafters import parse_speculative

    return parse_speculative(config.speculative) is not None


def speculation_from_args(args: argparse.Namespace, configs: list, own_log: str | None, seed: int):
    """The ``Speculation`` the run draws from (None when no config speculates), or a CLIError
    saying what is missing. ``own_log``: the workload, when it is a log (its rates are the default)."""
    from simulator.fleet.speculation import Speculation

    if not any(is_speculative(c) for c in configs):
        if args.acceptance is not None:
            print("note: --acceptance is ignored: no config speculates (--speculative ngram:K turns it on)")
        return None
    per = args.acceptance_per
    source = args.acceptance
    if source is not None and (rate := _rate(source)) is not None:
        if per == "request":
            raise CLIError("--acceptance-per request: needs --acceptance LOG (a constant rate is every request's)")
        return Speculation.constant(rate, seed=seed)
    if source is None:
        if own_log is None:
            raise CLIError("--speculative: a simulation draws drafts and their acceptance from rates: give "
                           "--acceptance LOG (a speculative log's) or --acceptance RATE (a constant per-token rate)")
        source, default_per = own_log, "request"
    else:
        if not Path(source).is_file():
            raise CLIError(f"--acceptance: {source}: no such file, and not a rate in [0, 1]")
        default_per = "workload"
    try:
        return Speculation.from_logs(_log_paths(source), per_request=(per or default_per) == "request", seed=seed)
    except ValueError as e:
        raise CLIError(f"--acceptance: {e}; give --acceptance LOG (a speculative log) or RATE") from None


def report_speculation(speculation, configs: list) -> None:
    """One line per distinct K simulated: where its rates come from."""
    from runtime.engine.drafters import parse_speculative

    if speculation is None:
        return
    for k in sorted({spec.num_tokens for c in configs if (spec := parse_speculative(c.speculative))}):
        print(f"speculative decoding, K={k}: {speculation.describe(k)}")
