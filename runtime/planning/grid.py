"""The settings a sweep varies, and a grid of them: ``'chunked=on,off budget=512,2048 replicas=1,2'``.

An axis is an engine setting (a config field by its dotted name: ``speculative`` too, off or a
drafter), a fleet setting (replicas, router) or ``acceptance``: the constant per-token rate a
speculative point's drafts are accepted with (a what-if over the workload's rates). A grid is the
axes in the order given, each with its values; its points are their cartesian product, the last
axis varying fastest. A point's text (``chunked=off budget=2048``) is how tables, plots and log
Headers name it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from runtime.engine.drafters import parse_speculative
from runtime.engine.routers import ROUTERS
from traces.acceptance import parse_rate


def _on_off(text: str) -> bool:
    value = {"on": True, "true": True, "off": False, "false": False}.get(text.lower())
    if value is None:
        raise ValueError(f"expected on or off, got {text!r}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be a positive integer, got {value}")
    return value


def _speculative(text: str) -> str:
    """``off`` or a drafter (``parse_speculative``'s rule), as the config spells it: ``""`` for off."""
    spec = parse_speculative(text)
    return str(spec) if spec is not None else ""


def _router(text: str) -> str:
    if text not in ROUTERS:
        raise ValueError(f"expected one of {', '.join(ROUTERS)}, got {text!r}")
    return text


@dataclass(frozen=True)
class Axis:
    name: str
    field: str | None  # the engine config field (dotted), None for a fleet or acceptance setting
    parse: Callable[[str], Any]
    help: str

    def show(self, value: Any) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float):
            return number_text(value)
        return str(value) or "off"  # speculative: "" is off


AXES: dict[str, Axis] = {a.name: a for a in (
    Axis("chunked", "scheduler.enable_chunked_prefill", _on_off, "chunked prefill on|off"),
    Axis("budget", "scheduler.max_num_batched_tokens", _positive, "token budget of a step"),
    Axis("max_seqs", "scheduler.max_num_seqs", _positive, "most requests running at once"),
    Axis("block_size", "cache.block_size", _positive, "tokens per KV block"),
    Axis("kv_blocks", "cache.num_blocks", _positive, "KV pool size in blocks"),
    Axis("policy", "scheduler.policy", str, "scheduling policy"),
    Axis("prefix_caching", "cache.enable_prefix_caching", _on_off, "prefix caching on|off"),
    Axis("speculative", "speculative", _speculative, "speculative decoding: off, ngram:K or model:PATH:K"),
    Axis("acceptance", None, parse_rate, "a speculative point's constant per-token acceptance rate"),
    Axis("replicas", None, _positive, "engine replicas behind one front door"),
    Axis("router", None, _router, "which replica takes a request"),
)}
FLEET_AXES = ("replicas", "router")


class GridError(ValueError):
    """A grid spec that can't be read; the message names the term."""


Settings = tuple[tuple[str, Any], ...]  # (axis, value) pairs in the grid's order


@dataclass(frozen=True)
class Grid:
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Grid:
        """``'chunked=on,off budget=512,2048'``: space-separated ``axis=v1,v2,...`` terms."""
        axes: list[tuple[str, tuple[Any, ...]]] = []
        for term in text.split():
            name, sep, values = term.partition("=")
            if not sep or not values:
                raise GridError(f"grid term {term!r}: expected AXIS=V1,V2,...")
            axis = AXES.get(name)
            if axis is None:
                raise GridError(f"grid term {term!r}: unknown axis {name!r} (known: {', '.join(AXES)})")
            if any(name == a for a, _ in axes):
                raise GridError(f"grid term {term!r}: axis {name!r} given twice")
            parsed = []
            for v in values.split(","):
                try:
                    value = axis.parse(v)
                except ValueError as e:
                    raise GridError(f"grid term {term!r}: {v!r}: {e}") from None
                if value not in parsed:
                    parsed.append(value)
            axes.append((name, tuple(parsed)))
        return cls(tuple(axes))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    def points(self) -> Iterator[Settings]:
        names = self.names
        for values in itertools.product(*(v for _, v in self.axes)):
            yield tuple(zip(names, values))

    def __len__(self) -> int:
        n = 1
        for _, values in self.axes:
            n *= len(values)
        return n


def number_text(x: float) -> str:
    """A number as it reads back exactly: ``2``, ``0.5``, ``11.313708498984761``."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def settings_text(settings: Settings) -> str:
    """``chunked=off budget=2048`` (``-`` for no setting: the base configuration)."""
    return " ".join(f"{name}={AXES[name].show(value)}" for name, value in settings) or "-"


def engine_options(settings: Settings) -> dict[str, Any]:
    """The engine config fields a point sets, by dotted name."""
    return {AXES[name].field: value for name, value in settings if AXES[name].field is not None}


def fleet_settings(settings: Settings, replicas: int, router: str) -> tuple[int, str]:
    """(replicas, router) of a point: its own where it sets them, else the given ones."""
    given = dict(settings)
    return int(given.get("replicas", replicas)), str(given.get("router", router))


def acceptance_setting(settings: Settings, acceptance: float | None) -> float | None:
    """A point's constant acceptance rate: its own where it sets one, else the given one."""
    return dict(settings).get("acceptance", acceptance)
