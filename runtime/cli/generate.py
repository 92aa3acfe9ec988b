"""``minivllm generate "prompt" ...``: offline generation with the real model; a progress bar for
batches, the completions on stdout, and ``--trace run.jsonl`` for the event log of the run (a log
already there is kept as run.1.jsonl, ... unless ``--trace-if-exists`` says error or overwrite)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from runtime.cli.config_flags import add_engine_args, announce_load, engine_options, flag_error
from runtime.cli.errors import CLIError
from traces.log import IF_EXISTS

SAMPLING_FLAGS = {
    "max_tokens": "--max-tokens", "min_tokens": "--min-tokens", "temperature": "--temperature",
    "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p", "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty", "repetition_penalty": "--repetition-penalty",
    "stop": "--stop", "logprobs": "--logprobs", "sampling_seed": "--sampling-seed",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts with the real model",
                       description="Generate completions offline. Prompts come from the arguments, "
                       "--prompts-file (one per line) or stdin ('-').")
    p.add_argument("prompts", nargs="*", help="prompt texts ('-' reads prompts from stdin, one per line)")
    p.add_argument("--prompts-file", metavar="FILE", help="one prompt per line")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message (chat template)")
    s = p.add_argument_group("sampling")
    s.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate (default: %(default)s)")
    s.add_argument("--min-tokens", type=int, default=0,
                   help="tokens to generate before EOS or a stop may end it (default: %(default)s)")
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    s.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling: smallest set of tokens with this much probability (default: %(default)s)")
    s.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens, 0 = all "
                   "(default: %(default)s)")
    s.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than this times the likeliest (default: %(default)s)")
    s.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtracted from the logit of every token already generated (default: %(default)s)")
    s.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtracted per occurrence of a token already generated (default: %(default)s)")
    s.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divides the logits of tokens seen in prompt or output, 1 = off (default: %(default)s)")
    s.add_argument("--sampling-seed", type=int,
                   help="seed of every request's stream (default: derived from --seed and the request)")
    s.add_argument("--stop", action="append", default=[], metavar="STR",
                   help="stop string (repeatable; default: none)")
    s.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    s.add_argument("--logprobs", type=int, help="also return the sampled token's logprob and the top N "
                   "(default: none)")
    add_engine_args(p)
    p.add_argument("--trace", metavar="PATH", help="write the event log of the run (JSONL, .gz ok)")
    p.add_argument("--trace-if-exists", choices=IF_EXISTS, default="rotate",
                   help="a log already at --trace: rotate keeps it as PATH.N (run.1.jsonl, ...), error stops, "
                        "overwrite replaces it (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = [x for x in args.prompts if x != "-"]
    if "-" in args.prompts:
        prompts += [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise CLIError(f"--prompts-file: cannot read {args.prompts_file}: {e.strerror}") from None
    if not prompts:
        raise CLIError("no prompts: give them as arguments, with --prompts-file, or '-' for stdin")
    return prompts


def _sampling_params(args: argparse.Namespace):
    from traces.params import InvalidRequest, SamplingParams

    try:
        return SamplingParams(
            max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty,
            seed=args.sampling_seed, stop=tuple(args.stop), ignore_eos=args.ignore_eos, logprobs=args.logprobs)
    except InvalidRequest as e:
        raise flag_error(e, SAMPLING_FLAGS) from None


def _check_trace(args: argparse.Namespace) -> None:
    """What would stop the log from being opened, before the (slow) model load."""
    if not args.trace:
        return
    trace = Path(args.trace)
    if trace.is_dir():
        raise CLIError(f"--trace: {trace} is a folder; give a file name (run.jsonl)")
    if args.trace_if_exists == "error" and trace.exists():
        raise CLIError(f"--trace: {trace}: a log is already there (--trace-if-exists error; "
                       "rotate keeps it under a numbered name)")


def run(args: argparse.Namespace) -> int:
    prompts = _read_prompts(args)
    params = _sampling_params(args)
    _check_trace(args)
    from runtime.engine.config import ConfigError
    from runtime.serving.llm import LLM
    from traces.params import InvalidRequest

    t0 = time.perf_counter()
    announce_load(args.model)
    try:
        llm = LLM(args.model, trace=args.trace, if_exists=args.trace_if_exists, tokenizer=args.tokenizer,
                  **engine_options(args))
    except ConfigError as e:
        raise flag_error(e) from None
    except FileExistsError as e:  # --trace-if-exists error, and a log appeared during the load
        raise CLIError(f"--trace: {e.filename}: a log is already there (--trace-if-exists error; "
                       "rotate keeps it under a numbered name)") from None
    rotated = llm.engine.writer.rotated_to if llm.engine.writer is not None else None
    if rotated is not None:
        print(f"--trace: moved the log already at {args.trace} to {rotated}", file=sys.stderr)
    load_s = time.perf_counter() - t0
    show = not args.no_progress
    t1 = time.perf_counter()
    try:
        if args.chat:
            outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=show)
        else:
            outs = llm.generate(prompts, params, use_tqdm=show)
    except InvalidRequest as e:
        raise flag_error(e, SAMPLING_FLAGS) from None
    finally:
        llm.close()
    elapsed = time.perf_counter() - t1
    for o in outs:
        if args.json:
            print(json.dumps({"prompt": o.prompt, "text": o.text, "token_ids": o.token_ids,
                              "finish_reason": o.finish_reason, "ttft": o.metrics.ttft, "e2e": o.metrics.e2e}))
        else:
            print(f"--- {o.prompt!r} [{o.finish_reason}, {len(o.token_ids)} tokens]\n{o.text}")
    n = sum(len(o.token_ids) for o in outs)
    print(f"{len(outs)} completions, {n} tokens in {elapsed:.2f} s ({n / elapsed:.1f} tok/s); "
          f"model {llm.parts.loaded.identity} loaded in {load_s:.1f} s on {llm.runner.device}"
          + (f"; event log: {args.trace}" if args.trace else ""), file=sys.stderr)
    return 0
