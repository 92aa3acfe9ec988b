"""Typed events of the engine log (a tagged union encoded with msgspec).

One JSON object per line, ``"type"`` first. Block events are small tagged arrays inside the
``Step`` (or ``Aborted``) that caused them, in the exact order the block manager applied them,
so ``fold`` can rebuild the block state step by step.
"""

from __future__ import annotations

from typing import Any

import msgspec

from traces.params import SamplingParams
from traces.prompt import Prompt

SCHEMA_VERSION = 2  # 1: one block event per block (traces/events_v1.py reads it)
READ_SCHEMA_VERSIONS = (1, 2)


class _Event(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    pass


# --- block operations: compact tagged arrays, e.g. ["alloc", 7, 120, 4] ----------------------------
#
# One operation per block-manager call, in the order the calls happened, so ``fold`` rebuilds the
# block state step by step. Block ids are runs (traces/block_runs.py): ``[first, count, ...]``.
# What ``fold`` can derive is not written: an eviction (allocating a cached, unreferenced block
# evicts it), the blocks a free releases (the request's whole table, tail first), the hash a block
# is cached under (a function of its tokens, which the log holds as far as its prompts record).


class _BlockEvent(msgspec.Struct, array_like=True, tag_field="type", frozen=True):
    pass


class BlockAllocated(_BlockEvent, tag="alloc"):
    """Blocks appended to a request's table, in order; each consumes one block of its reservation.
    A block that was cached (unreferenced, evictable) is evicted from the prefix cache first."""

    request_id: int
    runs: list[int]


class PrefixHit(_BlockEvent, tag="hit"):
    """Cached blocks appended to a request's table at admission (ref + 1 each)."""

    request_id: int
    runs: list[int]


class BlockCached(_BlockEvent, tag="cache"):
    """Fully computed blocks of a request registered in the prefix-cache index: ``runs`` of
    positions in its table (not block ids: they are those the table holds there)."""

    request_id: int
    runs: list[int]


class BlockFreed(_BlockEvent, tag="free"):
    """A request released its whole table (tail block first: the LRU order of the blocks it leaves
    evictable) and its reservation. At ref 0 a block becomes free, or evictable if cached."""

    request_id: int


class BlockTrimmed(_BlockEvent, tag="trim"):
    """A request's table cut to its first ``num_blocks`` blocks: the tail blocks held only KV of
    rejected speculative drafts (never cached); each goes back to the free list, tail first."""

    request_id: int
    num_blocks: int


class Reserved(_BlockEvent, tag="reserve"):
    """A request's block reservation set to ``num_blocks`` (at admission)."""

    request_id: int
    num_blocks: int


BlockEvent = BlockAllocated | PrefixHit | BlockCached | BlockFreed | BlockTrimmed | Reserved


class Span(msgspec.Struct, array_like=True, frozen=True):
    """One request's share of a step: positions [start, start + num_tokens); samples at the frontier."""

    request_id: int
    start: int
    num_tokens: int
    sample: bool


# --- lifecycle and step events -------------------------------------------------------------------


class Header(_Event, tag="Header", omit_defaults=False):
    schema_version: int = SCHEMA_VERSION
    clock: str = "wall"  # "wall" (live, seconds since engine start) or "sim" (virtual seconds)
    config: dict[str, Any] = {}
    model_identity: str = ""
    block_size: int = 16
    num_blocks: int = 0
    seed: int = 0
    eos_token_id: int | None = None
    versions: dict[str, str] = {}
    extra: dict[str, Any] = {}


class Arrived(_Event, tag="Arrived"):
    time: float
    request_id: int
    prompt: Prompt  # what the engine's trace_prompts let it record: ids, block hashes or length
    params: SamplingParams
    priority: int = 0
    cache_salt: str | None = None  # its prefix blocks are shared only with requests of the same salt


class Admitted(_Event, tag="Admitted"):
    time: float
    step: int
    request_id: int
    num_cached_tokens: int
    num_reserved_blocks: int


class Preempted(_Event, tag="Preempted"):
    time: float
    step: int
    request_id: int


class Step(_Event, tag="Step"):
    step: int
    start: float
    end: float
    spans: list[Span]
    tokens: list[list[int]]  # per sampling span, in span order
    block_events: list[BlockEvent] = []
    # speculative decoding: per sampling span, the drafts it verified (its span is 1 + len(drafts)
    # tokens); its tokens are the accepted drafts and one more. Absent when no span speculated.
    drafts: list[list[int]] = []
    # seconds the device spent on the step, from when it was free of the step before to the step's
    # last kernel (CUDA events), when the executor timed it (a profile sweep); end - start is the
    # host's view, which a launch of the next step can hold back
    device_time: float | None = None

    @property
    def extra_tokens(self) -> int:
        """Tokens beyond one per span: what an eager launch of this step handles (simulator/cost/launch.py)."""
        return sum(s.num_tokens for s in self.spans) - len(self.spans)


class Finished(_Event, tag="Finished"):
    time: float
    request_id: int
    reason: str
    num_output_tokens: int
    block_events: list[BlockEvent] = []  # only when finished outside a step (e.g. a stop string)


class Aborted(_Event, tag="Aborted"):
    time: float
    request_id: int
    reason: str
    block_events: list[BlockEvent] = []


class Rejected(_Event, tag="Rejected"):
    """A request ``add_request`` refused (InvalidRequest): never served, given no request id, so
    the log of the requests it did take is what it was without it. Analysis counts these: leaving
    out the longest requests would flatter every latency percentile."""

    time: float
    num_prompt_tokens: int
    params: SamplingParams
    reason: str  # the InvalidRequest message (what the client was told)
    priority: int = 0
    # the prompt as given, only in an ids log and only up to max_model_len tokens (a huge refused
    # prompt is its length alone)
    prompt: Prompt | None = None


class Routed(_Event, tag="Routed"):
    """A fleet's front door handed a request to a replica (the fleet log, traces/fleet_log.py):
    ``index`` in arrival order at the front door; ``request_id`` the replica's own id for it (None:
    the replica refused it, and its log has the ``Rejected``)."""

    time: float
    index: int
    replica: int
    request_id: int | None = None


class ReplicaDown(_Event, tag="ReplicaDown"):
    """A fleet's replica stopped on its own (its engine process died; the fleet log): its requests in
    flight ended with an error to their clients, and the router skips it until its ``ReplicaUp``."""

    time: float
    replica: int
    reason: str
    restarting: bool = True  # False: no restart left, it stays down


class ReplicaUp(_Event, tag="ReplicaUp"):
    """A fleet's replica started again after a ``ReplicaDown``: ``log`` is its new log (relative to the
    fleet log's folder; None: not recorded), whose request ids the ``Routed`` events after this one
    for ``replica`` name."""

    time: float
    replica: int
    log: str | None = None


Event = (Header | Arrived | Admitted | Preempted | Step | Finished | Aborted | Rejected | Routed | ReplicaDown
         | ReplicaUp)

# Header.extra key: what the Arrived events' prompts hold (traces.prompt.TRACE_PROMPTS); absent = "ids"
TRACE_PROMPTS_KEY = "trace_prompts"


def recorded_prompts(header: Header) -> str:
    """What a log's prompts hold: "ids" (token ids), "hashes" (block hashes) or "none" (lengths)."""
    return str(header.extra.get(TRACE_PROMPTS_KEY, "ids"))


def make_header(config: Any, *, clock: str, model_identity: str = "", eos_token_id: int | None = None,
                extra: dict[str, Any] | None = None) -> Header:
    """Header for a log of an engine built from ``config`` (an EngineConfig)."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    # installed distributions (metadata only: nothing is imported, and the header doesn't depend
    # on what the process happened to import)
    for dist in ("minivllm", "msgspec", "numpy", "torch", "triton", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return Header(
        clock=clock,
        config=config.to_dict(),
        model_identity=model_identity or config.model_identity,
        block_size=config.cache.block_size,
        num_blocks=config.cache.num_blocks,
        seed=config.seed,
        eos_token_id=eos_token_id,
        versions=versions,
        extra=extra or {},
    )
