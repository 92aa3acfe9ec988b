"""The ``minivllm`` command. Each subcommand lives in its own module with ``register(subparsers)``.

Errors a user can cause (bad flag value, missing file, malformed input) end in a one-line
message naming the flag, file or line, and exit status 2 — never a traceback. A flag the command
doesn't know is reported with that command's usage, not the top level's.

Output piped into a reader that stops early (``minivllm analyze run.jsonl | head -2``) ends
quietly with exit status 141, what a shell reports for a process killed by SIGPIPE (as ``cat`` or
``seq`` would be), so ``set -o pipefail`` scripts see the truncation and others don't care.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from runtime.cli.config_flags import check_config_flags, flag_error
from runtime.cli.errors import CLIError
from runtime.cli.notices import as_notices
from runtime.executor.cpu_threads import wait_passively

# module name -> subcommand(s) it registers; imported lazily so `minivllm --help` stays fast
COMMAND_MODULES = [
    "runtime.cli.bench",
    "runtime.cli.generate",
    "runtime.cli.serve",
    "runtime.cli.workload",
    "runtime.cli.simulate",
    "runtime.cli.sweep",
    "runtime.cli.search",
    "runtime.cli.replay",
    "runtime.cli.cost_model",
    "runtime.cli.profile",
    "runtime.cli.fidelity",
    "runtime.cli.fidelity_table",
    "runtime.cli.analyze",
    "runtime.cli.regress",
    "runtime.cli.log",
    "runtime.cli.demo",
]

EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE


class _Parser(argparse.ArgumentParser):
    """A (sub)command's parser: arguments it doesn't know are its error, shown with its usage.

    argparse hands a subcommand's leftovers up to the top-level parser, whose message would show
    ``usage: minivllm [-h] COMMAND ...``; every parser below the top level is one of these."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minivllm",
        description="LLM inference engine with an event log: serve, generate, simulate, replay, analyze.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    wait_passively()  # before torch loads its OpenMP runtime; engine processes inherit it
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # a range check on a flag (runtime/cli/checks.py) raises CLIError
        check_config_flags(args)  # before any model load
        with as_notices():
            rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, not in the interpreter's exit
        return rc
    except CLIError as e:
        parser.exit(2, f"minivllm: error: {e}\n")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (ValueError, FileNotFoundError) as e:
        # validation errors from config, requests, workloads and logs name their field/file/line;
        # one about a config field also names its flag
        parser.exit(2, f"minivllm: error: {flag_error(e)}\n")
    except OSError as e:  # e.g. --out naming a folder, a full disk: the path and the reason
        where = f"{e.filename}: " if e.filename else ""
        parser.exit(2, f"minivllm: error: {where}{e.strerror or e}\n")


def _quiet_stdout() -> None:
    """The reader of stdout is gone: point stdout at /dev/null so the interpreter's final flush of
    what is still buffered doesn't raise again ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout isn't a real file (captured in a test): nothing to redirect
        pass


if __name__ == "__main__":
    sys.exit(main())
