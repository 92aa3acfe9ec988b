"""The ``minivllm`` command. Each subcommand lives in its own module with ``register(subparsers)``.

Errors a user can cause (bad flag value, missing file, malformed input) end in a one-line
message naming the flag, file or line, and exit status 2 — never a traceback. A flag the command
doesn't know is one line naming the command and the nearest flag it does know; flags are never
abbreviated (``--max-num-seq`` is a typo, not ``--max-num-seqs``).

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
    """A (sub)command's parser: arguments it doesn't know are its error, in one line with the
    nearest flag it knows; no flag is abbreviated.

    argparse hands a subcommand's leftovers up to the top-level parser, whose message would name
    ``minivllm``; every parser below the top level is one of these."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._nearest(extras)}")
        return namespace, extras

    def _nearest(self, extras: list[str]) -> str:
        import difflib

        known = [s[2:] for action in self._actions for s in action.option_strings if s.startswith("--")]
        for word in extras:
            if word.startswith("--"):
                close = difflib.get_close_matches(word[2:].split("=", 1)[0], known, n=1, cutoff=0.75)
                if close:
                    return f" (did you mean --{close[0]}?)"
        return ""

    def error(self, message: str):
        """One line: the command, the error, where to look (argparse prints the whole usage)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minivllm", allow_abbrev=False,
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
