"""Engine configuration: frozen, validated dataclasses, the one source of every engine default.

Every field is checked in ``__post_init__``; a bad value raises ``ConfigError`` naming the field,
so a CLI flag or an HTTP parameter that feeds it gives a clear message instead of a traceback.
Fields made with ``option`` carry their help text: the CLI's engine flags are generated from them
(runtime/cli/config_flags.py), so a flag's default and help can't drift from the field's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from runtime.engine.drafters import SpeculativeError, parse_speculative
from runtime.engine.policies import POLICIES


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def option(default: Any, help: str, *, aliases: tuple[str, ...] = (), cli: bool = True, shown: str = "") -> Any:
    """A config field with its CLI help; its flag is ``--field-name`` (``--no-field-name`` too for a
    bool). ``aliases``: more spellings (a bool's ``no-…`` alias turns it off, any other takes
    ``on|off``); ``cli=False``: not a flag; ``shown``: the default as the help states it, where
    the field derives it."""
    return field(default=default, metadata={"help": help, "aliases": aliases, "cli": cli, "shown": shown})


def _check(cond: bool, name: str, value: Any, rule: str) -> None:
    if not cond:
        raise ConfigError(f"{name} {rule}, got {value!r}")


def _positive_int(name: str, value: Any) -> None:
    _check(isinstance(value, int) and not isinstance(value, bool) and value > 0, name, value,
           "must be a positive integer")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = option(16, "tokens per KV block (a power of two)")
    num_blocks: int = option(1024, "KV pool size in blocks")
    enable_prefix_caching: bool = option(True, "reuse the KV of full blocks shared with earlier prompts",
                                         aliases=("prefix-caching", "no-prefix-caching"))
    # The prefix-hash chain is rooted in model identity + salt: two models (or tenants) never share KV.
    hash_salt: str = option("", "roots the prefix-hash chain beside the model identity", cli=False)

    def __post_init__(self) -> None:
        _positive_int("cache.block_size", self.block_size)
        _check(self.block_size & (self.block_size - 1) == 0, "cache.block_size", self.block_size,
               "must be a power of two")
        _positive_int("cache.num_blocks", self.num_blocks)
        _check(isinstance(self.enable_prefix_caching, bool), "cache.enable_prefix_caching",
               self.enable_prefix_caching, "must be a bool")
        _check(isinstance(self.hash_salt, str), "cache.hash_salt", self.hash_salt, "must be a string")


DEFAULT_BATCHED_TOKENS = 2048


def default_batched_tokens(enable_chunked_prefill: bool, max_model_len: int) -> int:
    """The step token budget when none is given, as in vLLM: 2048 with chunked prefill; without it a
    whole prompt must fit one step, so ``max(max_model_len, 2048)``."""
    if enable_chunked_prefill:
        return DEFAULT_BATCHED_TOKENS
    return max(max_model_len, DEFAULT_BATCHED_TOKENS)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """``max_num_batched_tokens=None`` (the default): ``default_batched_tokens`` of the other fields,
    filled in at construction, so a built config always holds a number."""

    max_num_batched_tokens: int | None = option(
        None, "token budget of one step (decode tokens + prefill chunks)",
        shown=f"{DEFAULT_BATCHED_TOKENS}; with chunked prefill off, max(max_model_len, {DEFAULT_BATCHED_TOKENS})")
    max_num_seqs: int = option(256, "most requests running at once")
    enable_chunked_prefill: bool = option(True, "split long prompts over steps so decodes never wait for a "
                                          "whole prompt", aliases=("chunked", "no-chunked-prefill"))
    reserve_full_prompt: bool = option(True, "admission reserves the KV of the whole prompt (off: of its "
                                       "first chunk only)")
    policy: str = option("fcfs", "scheduling policy: " + " | ".join(POLICIES) + " (priority: a request's "
                         "priority orders admission and preemption, lower first)")
    max_model_len: int = option(4096, "longest prompt + output a request may have")

    def __post_init__(self) -> None:
        _positive_int("scheduler.max_num_seqs", self.max_num_seqs)
        _positive_int("scheduler.max_model_len", self.max_model_len)
        for name in ("enable_chunked_prefill", "reserve_full_prompt"):
            value = getattr(self, name)
            _check(isinstance(value, bool), f"scheduler.{name}", value, "must be a bool")
        if self.max_num_batched_tokens is None:
            object.__setattr__(self, "max_num_batched_tokens",
                               default_batched_tokens(self.enable_chunked_prefill, self.max_model_len))
        _positive_int("scheduler.max_num_batched_tokens", self.max_num_batched_tokens)
        _check(self.policy in POLICIES, "scheduler.policy", self.policy,
               f"must be one of {', '.join(map(repr, POLICIES))}")

    def replace(self, **changes: Any) -> SchedulerConfig:
        """A copy with ``changes``. The budget goes with chunked prefill: where the changes turn it
        on or off, or change max_model_len while it is off, and don't give the budget, the copy's
        budget is the default for its fields (``default_batched_tokens``), as if it had never been
        set; otherwise it stays as it is."""
        chunked = changes.get("enable_chunked_prefill", self.enable_chunked_prefill)
        toggled = chunked != self.enable_chunked_prefill
        resized = not chunked and changes.get("max_model_len", self.max_model_len) != self.max_model_len
        if "max_num_batched_tokens" not in changes and (toggled or resized):
            changes = {**changes, "max_num_batched_tokens": None}
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Identity of the weights the KV belongs to (name + revision/hash); roots the prefix-hash chain.
    model_identity: str = option("unknown", "the weights the KV belongs to", cli=False)
    seed: int = option(0, "engine seed: every request's sampling stream derives from it")
    speculative: str = option("", "speculative decoding: ngram:K (prompt lookup) or model:PATH:K (a draft model "
                              "sharing the tokenizer); each decoding request verifies up to K drafted tokens a "
                              "step", shown="off")

    def __post_init__(self) -> None:
        _check(isinstance(self.cache, CacheConfig), "cache", self.cache, "must be a CacheConfig")
        _check(isinstance(self.scheduler, SchedulerConfig), "scheduler", self.scheduler,
               "must be a SchedulerConfig")
        _check(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed", self.seed,
               "must be an integer")
        _check(isinstance(self.speculative, str), "speculative", self.speculative, "must be a string")
        try:
            parse_speculative(self.speculative)
        except SpeculativeError as e:
            raise ConfigError(f"speculative {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``speculative`` only when on (a log's Header of a plain engine reads as before)."""
        data = dataclasses.asdict(self)
        if not self.speculative:
            del data["speculative"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        data = dict(data)
        cache = CacheConfig(**data.pop("cache", {}))
        scheduler = SchedulerConfig(**data.pop("scheduler", {}))
        return cls(cache=cache, scheduler=scheduler, **data)

    def replace(self, **changes: Any) -> EngineConfig:
        """Copy with changes; nested fields by dotted name, e.g. ``{"scheduler.max_num_seqs": 8}``
        (the scheduler's by ``SchedulerConfig.replace``: the budget follows chunked prefill)."""
        cache = {k.split(".", 1)[1]: v for k, v in changes.items() if k.startswith("cache.")}
        sched = {k.split(".", 1)[1]: v for k, v in changes.items() if k.startswith("scheduler.")}
        top = {k: v for k, v in changes.items() if "." not in k}
        return dataclasses.replace(
            self,
            cache=dataclasses.replace(self.cache, **cache),
            scheduler=self.scheduler.replace(**sched),
            **top,
        )
