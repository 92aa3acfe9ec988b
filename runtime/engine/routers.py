"""Routers: which engine replica serves a request. Pure policies (no torch, no clock, no global
state) shared by the simulated fleet (simulator/fleet) and the live data-parallel front door
(``minivllm serve --data-parallel-size N``), so a what-if and its live twin route alike.

A router sees the request (its index in arrival order, prompt length, prefix key) and, per
replica, what a front door can observe of it (``ReplicaLoad``): the requests it was handed and
has not finished, the prompt tokens of those still waiting for their first token, and the share
of its KV blocks in use. Registry: ``ROUTERS``; ``make_router(name, replicas)``.

- ``round-robin``: replica ``i mod N`` for the i-th request.
- ``least-loaded``: the fewest queued prompt tokens, then the least KV in use, then the fewest
  outstanding requests, then the lowest index.
- ``prefix-affinity``: the replica its prefix key hashes to (rendezvous hashing: stable as
  replicas are added), unless that one's queued prompt tokens exceed the least-loaded replica's
  by more than ``slack_tokens``; then least-loaded. Requests that share a prompt prefix meet on one
  replica, whose prefix cache then serves them.

A replica that is down (``up[i]`` False: its engine died and is starting again) is never chosen:
round-robin takes the next one up, the others choose among those up (rendezvous hashing moves only
the down replica's prefixes). The caller passes at least one replica up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PREFIX_KEY_TOKENS = 256  # the leading prompt tokens a prefix key hashes
DEFAULT_SLACK_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class RouteRequest:
    index: int  # in arrival order at the front door
    num_prompt_tokens: int
    prefix_key: int | None = None  # ``prefix_key(token_ids)``; only prefix-affinity needs it


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    outstanding: int = 0  # requests handed in and not finished
    queued_tokens: int = 0  # prompt tokens of those without a first token yet
    kv_used: float = 0.0  # share of the KV blocks in use (0..1)


def prefix_key(token_ids: Sequence[int], n: int = PREFIX_KEY_TOKENS) -> int:
    """A stable 64-bit key of a prompt's first ``n`` tokens (equal prefixes, equal keys)."""
    head = list(token_ids[:n])
    digest = hashlib.blake2b(b"".join(t.to_bytes(4, "little", signed=True) for t in head), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def _candidates(n: int, up: Sequence[bool] | None) -> list[int] | range:
    return range(n) if up is None else [i for i in range(n) if up[i]]


def _least_loaded(loads: Sequence[ReplicaLoad], up: Sequence[bool] | None = None) -> int:
    return min(_candidates(len(loads), up),
               key=lambda i: (loads[i].queued_tokens, loads[i].kv_used, loads[i].outstanding, i))


class RoundRobin:
    name = "round-robin"
    needs_prefix = False
    reads_load = False  # its choice does not depend on the replicas' state

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def route(self, request: RouteRequest, loads: Sequence[ReplicaLoad], up: Sequence[bool] | None = None) -> int:
        first = request.index % self.replicas
        if up is None or up[first]:
            return first
        return next(i % self.replicas for i in range(first + 1, first + self.replicas) if up[i % self.replicas])


class LeastLoaded:
    name = "least-loaded"
    needs_prefix = False
    reads_load = True

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def route(self, request: RouteRequest, loads: Sequence[ReplicaLoad], up: Sequence[bool] | None = None) -> int:
        return _least_loaded(loads, up)


class PrefixAffinity:
    name = "prefix-affinity"
    needs_prefix = True
    reads_load = True

    def __init__(self, replicas: int, slack_tokens: int = DEFAULT_SLACK_TOKENS) -> None:
        self.replicas, self.slack_tokens = replicas, slack_tokens

    def home(self, key: int, up: Sequence[bool] | None = None) -> int:
        """The replica a prefix key belongs to (highest random weight), of those up."""
        def weight(i: int) -> int:
            h = hashlib.blake2b(key.to_bytes(8, "little") + i.to_bytes(4, "little"), digest_size=8)
            return int.from_bytes(h.digest(), "little")
        return max(_candidates(self.replicas, up), key=weight)

    def route(self, request: RouteRequest, loads: Sequence[ReplicaLoad], up: Sequence[bool] | None = None) -> int:
        best = _least_loaded(loads, up)
        if request.prefix_key is None:
            return best
        home = self.home(request.prefix_key, up)
        if loads[home].queued_tokens - loads[best].queued_tokens > self.slack_tokens:
            return best
        return home


Router = RoundRobin | LeastLoaded | PrefixAffinity
ROUTERS: dict[str, Callable[[int], Router]] = {r.name: r for r in (RoundRobin, LeastLoaded, PrefixAffinity)}


def make_router(name: str, replicas: int) -> Router:
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    try:
        return ROUTERS[name](replicas)
    except KeyError:
        raise ValueError(f"unknown router {name!r} (known: {', '.join(ROUTERS)})") from None
