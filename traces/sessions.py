"""Conversations: workloads whose requests are turns, each waiting for the one before it.

A turn (``RequestSpec.session`` set) arrives no earlier than its own ``arrival`` and
``think_time`` after the previous turn of its session (the one before it in the workload)
finished: a closed loop, as a person at a chat window is. The simulator releases turns so
(simulator/fleet/sessions.py); a workload without sessions is open loop.

- ``generate_sessions``: synthetic conversations. A turn's prompt is the previous turn's prompt,
  the previous answer and a new message, as a chat template renders it, so each turn's prompt
  extends the last one's and a prefix cache serves the repeated part.
- ``chain_sessions``: the conversations of a trace whose prompts are block hash ids (Mooncake):
  a request whose ids extend an earlier request's ids is that conversation's next turn (each
  request continued at most once; a later extension of the same prefix starts a conversation of
  its own). The trace's own arrival stays each turn's lower bound.
"""

from __future__ import annotations

import msgspec
import numpy as np

from traces.generators import LengthDist, arrival_times
from traces.prompt import PromptSynthetic
from traces.workload import RequestSpec, Workload, WorkloadError, synthetic_prompt, trace_params

SEGMENT_TOKENS = 64  # tokens per synthetic conversation segment (a multiple of every block size up to 64)


def generate_sessions(num_sessions: int, *, rate: float, turns: LengthDist | str = "uniform:2:6",
                      think_time: float = 5.0, first_len: LengthDist | str = "uniform:64:512",
                      message_len: LengthDist | str = "uniform:16:128", output_len: LengthDist | str = "uniform:16:256",
                      cv: float = 1.0, seed: int = 0) -> Workload:
    """``num_sessions`` conversations starting at ``rate`` per second; a turn's message and answer
    lengths are rounded up to whole segments (``SEGMENT_TOKENS``) so that its prompt is the last
    prompt's segments, the answer's, and the new message's. Think times are exponential with mean
    ``think_time`` seconds."""
    if num_sessions < 0:
        raise WorkloadError(f"number of sessions must be >= 0, got {num_sessions}")
    if not think_time >= 0:
        raise WorkloadError(f"think time must be >= 0, got {think_time}")
    dists = {name: LengthDist.parse(d, seed=seed) if isinstance(d, str) else d
             for name, d in (("turns", turns), ("first", first_len), ("message", message_len), ("output", output_len))}
    starts = arrival_times(num_sessions, rate, cv, np.random.default_rng([seed, 11]))
    n_turns = dists["turns"].sample(np.random.default_rng([seed, 12]), num_sessions)
    rng = np.random.default_rng([seed, 13])
    requests, next_segment = [], 1
    for s in range(num_sessions):
        segments: list[int] = []
        for t in range(int(n_turns[s])):
            new = int(dists["first" if t == 0 else "message"].sample(rng, 1)[0])
            k = -(-new // SEGMENT_TOKENS)
            segments += range(next_segment, next_segment + k)
            next_segment += k
            out = int(dists["output"].sample(rng, 1)[0])
            think = float(rng.exponential(think_time)) if think_time > 0 and t else 0.0
            prompt = synthetic_prompt(len(segments) * SEGMENT_TOKENS, seed, unique_seed=next_segment,
                                      segment_ids=list(segments), segment_len=SEGMENT_TOKENS)
            requests.append(RequestSpec(arrival=float(starts[s]), prompt=prompt, params=trace_params(out),
                                        session=s, think_time=think))
            k = -(-out // SEGMENT_TOKENS)  # the answer, as the next turn's prompt holds it
            segments += range(next_segment, next_segment + k)
            next_segment += k
    meta = {"format": "sessions", "sessions": num_sessions, "rate": rate, "think_time": think_time,
            "turns": str(turns)}
    return Workload(requests, seed=seed, source="generated sessions", meta=meta)


def chain_sessions(workload: Workload, think_time: float = 0.0) -> Workload:
    """The conversations of a workload of block-hash prompts (see the module docstring)."""
    open_ends: dict[tuple[int, ...], int] = {}  # a request's ids -> its session, until continued
    out, sessions = [], 0
    for r in workload.requests:
        ids = tuple(r.prompt.segment_ids) if isinstance(r.prompt, PromptSynthetic) else ()
        session = None
        for n in range(len(ids) - 1, 0, -1):
            session = open_ends.pop(ids[:n], None)
            if session is not None:
                break
        if session is None:
            session, sessions = sessions, sessions + 1
        if ids:
            open_ends[ids] = session
        out.append(msgspec.structs.replace(r, session=session, think_time=think_time))
    chained = workload._derive(out, f"chain_sessions(think_time={think_time})")
    chained.meta["sessions"] = sessions
    return chained
