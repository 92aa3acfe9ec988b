"""``--cost-model M`` as every command reads it: a JSON file, a shipped name (``qwen3-0.6b-h200``),
``recorded:LOG``, or ``recorded`` (the durations of the log the command reads, where there is one)."""

from __future__ import annotations

from runtime.cli.errors import CLIError


def load(spec: str, *, log: str | None = None, flag: str | None = "--cost-model"):
    """The cost model ``spec`` names; a user error names ``flag`` (None: a positional argument)."""
    from simulator.cost.loading import load_cost_model
    from simulator.cost.recorded_model import RecordedCostModel

    if spec == "recorded" and log is None:
        raise CLIError(_named(flag, "'recorded' needs a recorded log to take the step times from"))
    try:
        return RecordedCostModel.from_log(log) if spec == "recorded" else load_cost_model(spec)
    except (ValueError, OSError) as e:  # no such file or name; not a cost model
        raise CLIError(_named(flag, str(e))) from None


def _named(flag: str | None, message: str) -> str:
    return f"{flag}: {message}" if flag else message
