"""``minivllm log upgrade OLD NEW``: a log of an older schema rewritten in today's;
``minivllm log redact LOG NEW --prompts hashes|none``: a log's prompt token ids left out.

    minivllm log upgrade live-2026-11.jsonl.gz live-2026-11.v2.jsonl.gz
    minivllm log redact live.jsonl.gz shareable.jsonl.gz --prompts hashes

Every command reads older logs as they are (converted while read); upgrading once makes the file
smaller (schema 2 writes block operations as runs, leaves out what earlier events say, and joins
runs of plain decode steps) and spares the conversion on every later read. The new log is read
back and checked against the old before the command succeeds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.cli.errors import CLIError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("log", help="event-log files: upgrade an older schema, redact prompts")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    u = actions.add_parser("upgrade", help="rewrite a log of an older schema in today's (read back and checked)")
    u.add_argument("old", metavar="OLD", help="the log to read (any schema this minivllm reads)")
    u.add_argument("new", metavar="NEW", help="the log to write (.jsonl or .jsonl.gz)")
    u.add_argument("--force", action="store_true", help="overwrite NEW if it exists (default: refuse)")
    u.set_defaults(func=run_upgrade)
    r = actions.add_parser("redact", help="rewrite a log without its prompts' token ids (read back and checked)")
    r.add_argument("old", metavar="LOG", help="a log whose prompts are token ids")
    r.add_argument("new", metavar="NEW", help="the log to write (.jsonl or .jsonl.gz)")
    r.add_argument("--prompts", choices=("hashes", "none"), default="hashes",
                   help="what to keep of each prompt: its length and one hash per full KV block (prefix "
                        "reuse stays visible to a re-simulation), or its length alone (default: %(default)s)")
    r.add_argument("--force", action="store_true", help="overwrite NEW if it exists (default: refuse)")
    r.set_defaults(func=run_redact)


def run_upgrade(args: argparse.Namespace) -> int:
    from traces.log_upgrade import upgrade_log

    if not Path(args.old).is_file():
        raise CLIError(f"{args.old}: no such file")
    try:
        done = upgrade_log(args.old, args.new, if_exists="overwrite" if args.force else "error")
    except FileExistsError:
        raise CLIError(f"{args.new}: a file is already there (--force overwrites it)") from None
    same = " (already today's schema: rewritten as is)" if done.from_version == done.to_version else ""
    print(f"{args.old} (schema {done.from_version}, {done.old_bytes:,} bytes) → {args.new} (schema {done.to_version}, "
          f"{done.new_bytes:,} bytes): {done.events:,} events, read back equal{same}")
    return 0


def run_redact(args: argparse.Namespace) -> int:
    from runtime.engine.config import EngineConfig
    from runtime.engine.core import EngineCore
    from traces.log_redact import redact_log

    def recorder_for(header):  # the engine that wrote the log, keeping what --prompts keeps
        core = EngineCore(EngineConfig.from_dict(header.config), eos_token_id=header.eos_token_id,
                          trace_prompts=args.prompts)
        return core.prompts.recorded

    if not Path(args.old).is_file():
        raise CLIError(f"{args.old}: no such file")
    try:
        done = redact_log(args.old, args.new, args.prompts, recorder_for,
                          if_exists="overwrite" if args.force else "error")
    except FileExistsError:
        raise CLIError(f"{args.new}: a file is already there (--force overwrites it)") from None
    except ValueError as e:
        raise CLIError(str(e)) from None
    print(f"{args.old} ({done.old_bytes:,} bytes) → {args.new} ({done.new_bytes:,} bytes): {done.prompts:,} prompts "
          f"kept as {done.mode}, {done.events:,} events, read back equal")
    return 0
