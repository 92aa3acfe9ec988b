"""Runs of plain decode steps landed at once: the simulator's fast path.

While every running request decodes one token a step, nothing waits, nothing arrives and no token
value matters, each step is the one before it with one more token per request. The scheduler says
how many such steps follow a planned one (``Scheduler.decode_run``: its own rules, and the block
manager's for blocks that fit); the block manager applies their allocations and cached blocks at
once (``BlockManager.grow_decodes``); this module writes the log of those steps, as many loop turns
would (tests/test_sim_plain_runs.py, tests/test_closed_loop_fleet.py prove it byte for byte).
"""

from __future__ import annotations

from runtime.engine.core import EngineCore
from runtime.engine.types import StepPlan
from traces.events import Span, Step


def decode_run(core: EngineCore, plan: StepPlan) -> int:
    """How many steps, ``plan`` (planned, not advanced) the first, are plain decodes that can be
    landed at once; 0 when ``plan`` is not one."""
    return 0 if core.tokens_matter else core.scheduler.decode_run(plan)


def land_decode_run(core: EngineCore, plan: StepPlan, ends: list[float], start: float, token: int) -> None:
    """Apply ``plan`` and the ``len(ends) - 1`` decode steps after it (``decode_run`` allowed at least
    ``len(ends)``), each sampling ``token``, the steps tiling from ``start``, step i ending at
    ``ends[i]``: the requests, the pool and the log are what planning and committing them one by one
    leaves; the step after them is not planned."""
    m = len(ends)
    bm = core.block_manager
    spans = plan.spans
    reqs = [core.requests[s.request_id] for s in spans]
    starts = [s.start for s in spans]
    for req in reqs:
        req.token_ids.extend([token] * m)  # (block hashes read them only up to a full block)
    pending = bm.drain_events()  # the first step's plan's
    blocks = bm.grow_decodes(reqs, starts, m)
    if pending:
        blocks[0] = pending + blocks.get(0, [])
    for req, c in zip(reqs, starts):
        req.num_computed_tokens = c + m
    core.landed(plan, m)
    sink = core.sink
    if sink is None:
        return
    first = plan.step
    tokens = [[token]] * len(reqs)

    def spans_of(i: int) -> list[Span]:
        return spans if i == 0 else [Span(s.request_id, s.start + i, 1, True) for s in spans]

    # a LogWriter takes the steps after one it wrote without its spans at once (decode_steps)
    bulk = getattr(sink, "decode_steps", None)
    for i in range(m):
        if i and bulk is not None and bulk(ends[i:], {j - i: b for j, b in blocks.items() if j >= i},
                                           spans_of(m - 2), spans_of(m - 1), token):
            return
        sink(Step(step=first + i, start=start if i == 0 else ends[i - 1], end=ends[i], spans=spans_of(i),
                  tokens=tokens, block_events=blocks.get(i, [])))
