"""The fleet flags of ``simulate``: how many replicas, which router, and what differs per replica.

    --replicas 4 --router least-loaded
    --replica "1: --max-num-seqs 64 --cost-model other.json"   (repeatable; other replicas as the rest)
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import Any

from runtime.cli import cost_models
from runtime.cli.checks import Bounded
from runtime.cli.config_flags import add_config_flags, config_options
from runtime.cli.errors import CLIError
from runtime.engine.routers import ROUTERS


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fleet (data-parallel replicas behind one front door)")
    g.add_argument("--replicas", type=int, default=1, action=Bounded, at_least=1,
                   help="engine replicas (default: %(default)s); with more than one, --out is the fleet log "
                        "of routing decisions and each replica's log goes beside it (OUT.replicaI.jsonl...)")
    g.add_argument("--router", choices=list(ROUTERS), default="round-robin",
                   help="which replica takes a request (default: %(default)s)")
    g.add_argument("--devices", type=int, action=Bounded, at_least=1, metavar="M",
                   help="devices the replicas are placed on, replica i on device i mod M; replicas on one device "
                        "run their steps' device work one after another (default: one device each)")
    g.add_argument("--replica", action="append", default=[], metavar="I:FLAGS",
                   help='engine flags or --cost-model for replica I alone, e.g. "1: --max-num-seqs 64"')


def _replica_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="--replica", add_help=False, exit_on_error=False)
    p.add_argument("--cost-model")
    add_config_flags(p, ("cache", "scheduler", ""))
    return p


@dataclass(frozen=True)
class ReplicaOverride:
    options: dict[str, Any]
    cost_model: str | None


def replica_overrides(args: argparse.Namespace) -> dict[int, ReplicaOverride]:
    """``--replica I:FLAGS`` by replica; a bad one ends in a line naming it."""
    out: dict[int, ReplicaOverride] = {}
    parser = _replica_parser()
    for spec in args.replica:
        head, sep, flags = spec.partition(":")
        try:
            i = int(head)
        except ValueError:
            i = -1
        if not sep or not 0 <= i < args.replicas:
            raise CLIError(f"--replica {spec!r}: give I:FLAGS with I a replica, 0 to {args.replicas - 1}")
        try:
            sub, rest = parser.parse_known_args(shlex.split(flags))
        except (argparse.ArgumentError, ValueError) as e:
            raise CLIError(f"--replica {spec!r}: {e}") from None
        if rest:
            raise CLIError(f"--replica {spec!r}: not a simulate engine flag: {' '.join(rest)}")
        out[i] = ReplicaOverride(config_options(sub), sub.cost_model)
    return out


def placement(args: argparse.Namespace) -> list[int] | None:
    """The device of each replica (``--devices``), or None: one each."""
    from simulator.fleet.device import place

    if args.devices is None:
        return None
    try:
        return place(args.replicas, args.devices)
    except ValueError as e:
        raise CLIError(f"--devices: {e}") from None


def replica_models(args: argparse.Namespace, shared: Any, overrides: dict[int, ReplicaOverride]) -> list[Any]:
    return [cost_models.load(o.cost_model, flag="--replica") if (o := overrides.get(i)) and o.cost_model else shared
            for i in range(args.replicas)]
