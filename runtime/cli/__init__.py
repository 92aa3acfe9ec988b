"""The ``minivllm`` command. Each subcommand lives in its own module with ``register(subparsers)``.

Errors a user can cause (bad flag value, missing file, malformed input) end in a one-line
message naming the flag, file or line, and exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from runtime.cli.config_flags import flag_error
from runtime.cli.errors import CLIError

# module name -> subcommand(s) it registers; imported lazily so `minivllm --help` stays fast
COMMAND_MODULES = [
    "runtime.cli.bench",
    "runtime.cli.generate",
    "runtime.cli.serve",
    "runtime.cli.workload",
    "runtime.cli.simulate",
    "runtime.cli.replay",
    "runtime.cli.cost_model",
    "runtime.cli.profile",
    "runtime.cli.analyze",
    "runtime.cli.demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minivllm",
        description="LLM inference engine with an event log: serve, generate, simulate, replay, analyze.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CLIError as e:
        parser.exit(2, f"minivllm: error: {e}\n")
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError) as e:
        # validation errors from config, requests, workloads and logs name their field/file/line;
        # one about a config field also names its flag
        parser.exit(2, f"minivllm: error: {flag_error(e)}\n")


if __name__ == "__main__":
    sys.exit(main())
