"""The ``minivllm simulate`` command that re-runs one point of a sweep or a search alone: the same
workload flags, the point's rate scale, the command line's engine flags with the point's settings
over them, its fleet, a speculative point's acceptance rates, and ``--point`` (the log's Header
names it). Its summary is the point's row."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from typing import Any

from runtime.cli.acceptance_flags import is_speculative
from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.planning.grid import engine_options, number_text


def _field(dotted: str) -> dataclasses.Field:
    group, _, name = dotted.rpartition(".")
    cls = {"cache": CacheConfig, "scheduler": SchedulerConfig, "": EngineConfig}[group]
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def option_flags(options: dict[str, Any]) -> list[str]:
    """Engine flags that set ``options`` (dotted names): ``--chunked off``, ``--max-num-seqs 64``."""
    out: list[str] = []
    for dotted, value in options.items():
        f = _field(dotted)
        flag = f.name.replace("_", "-")
        if isinstance(value, bool):
            alias = next((a for a in f.metadata.get("aliases", ()) if not a.startswith("no-")), None)
            out += [f"--{alias}", "on" if value else "off"] if alias else [f"--{flag}" if value else f"--no-{flag}"]
        else:
            out += [f"--{flag}", str(value) or "off"]  # speculative: "" is off
    return out


def _workload_flags(args: argparse.Namespace) -> list[str]:
    out = []
    if args.workload_format != "auto":
        out += ["--format", args.workload_format]
    if args.time_window is not None:
        out += ["--time-window", f"{number_text(args.time_window[0])}:{number_text(args.time_window[1])}"]
    if args.limit is not None:
        out += ["--limit", str(args.limit)]
    for flag, value in (("--input-scale", args.input_scale), ("--output-scale", args.output_scale)):
        if value != 1.0:
            out += [flag, number_text(value)]
    if args.skip_bad_rows:
        out.append("--skip-bad-rows")
    if args.chain_sessions:
        out += ["--chain-sessions", "--think-time", number_text(args.think_time)]
    return out


def _acceptance_flags(args: argparse.Namespace, point) -> list[str]:
    """Where a speculative point's rates came from: its constant rate, else the command line's log
    (none given: the workload's own, simulate's default too)."""
    if not is_speculative(point.config):
        return []
    if point.acceptance is not None:
        return ["--acceptance", number_text(point.acceptance)]
    out = ["--acceptance", args.acceptance] if args.acceptance is not None else []
    return out + (["--acceptance-per", args.acceptance_per] if args.acceptance_per is not None else [])


def simulate_command(args: argparse.Namespace, plan_options: dict[str, Any], point, out: str) -> str:
    """The command line of ``point`` (a runtime.planning.sweep.Point), writing its log to ``out``."""
    words = ["minivllm", "simulate", args.workload, "--cost-model", str(args.cost_model), *_workload_flags(args),
             "--rate-scale", number_text(point.rate_scale),
             *option_flags({**plan_options, **engine_options(point.settings)})]
    if point.replicas > 1:
        words += ["--replicas", str(point.replicas), "--router", point.router]
    words += _acceptance_flags(args, point)
    words += ["--point", point.text, "--out", out]
    return shlex.join(words)
