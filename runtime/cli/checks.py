"""Range checks on a flag's value, declared beside the flag:

    g.add_argument("--limit", type=int, action=Bounded, at_least=1, help=...)

A value out of range is a user error naming the flag (``minivllm: error: --limit: must be >= 1,
got -1``, exit 2) rather than argparse's usage dump, the same form as an engine flag's error.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from runtime.cli.errors import CLIError


def flag_of(action: argparse.Action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.metavar or action.dest


class Bounded(argparse.Action):
    """Store a number after checking it: ``at_least`` (>=), ``above`` (>) and/or ``below`` (<); NaN never
    passes."""

    def __init__(self, *args: Any, at_least: float | None = None, above: float | None = None,
                 below: float | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.at_least, self.above, self.below = at_least, above, below

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        for value in values if isinstance(values, list) else [values]:
            check_number(flag_of(self), value, at_least=self.at_least, above=self.above, below=self.below)
        setattr(namespace, self.dest, values)


def check_number(flag: str, value: float, *, at_least: float | None = None, above: float | None = None,
                 below: float | None = None) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise CLIError(f"{flag}: must be a finite number, got {value}")
    if at_least is not None and not value >= at_least:
        raise CLIError(f"{flag}: must be >= {at_least:g}, got {value:g}")
    if above is not None and not value > above:
        raise CLIError(f"{flag}: must be > {above:g}, got {value:g}")
    if below is not None and not value < below:
        raise CLIError(f"{flag}: must be < {below:g}, got {value:g}")


class BoundedOrAuto(Bounded):
    """``Bounded``, or the word ``auto`` (stored as it is, for the command to resolve)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values == "auto":
            setattr(namespace, self.dest, values)
            return
        super().__call__(parser, namespace, values, option_string)


def int_or_auto(value: str) -> int | str:
    return value if value == "auto" else int(value)
