"""Execute-replay: drive an executor with a log's recorded plans and compare its tokens to the log.

The plans come from ``LoggedPolicy`` (same spans, same order, block tables rebuilt from the
log's block events), so the executor sees exactly the batches of the recording. Recorded tokens
are fed back after every step (teacher forcing): a mismatch is reported at the step where it
happens and does not cascade.

Any object with ``execute(plan, requests) -> StepResult`` works; the real runtime's is built by
``runtime.executor.setup.replay_executor_factory`` and wired in by ``minivllm replay --execute``
(the simulator itself never imports the executor, or torch).

The log must hold its prompts' token ids: one recorded with ``--trace-prompts hashes|none`` is
refused (LogError) before the executor is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.engine.types import Executor
from simulator.replay.policy import LoggedPolicy
from traces.events import Event, Header
from traces.log import LogError, read_log


@dataclass
class Divergence:
    step: int
    request_id: int
    position: int  # index in the request's token sequence of the first differing token
    expected: list[int]
    got: list[int]
    context: str


@dataclass
class ExecuteReport:
    steps: int = 0
    compared_tokens: int = 0
    mismatched_steps: int = 0
    first: Divergence | None = None
    durations: list[tuple[float, float]] = field(default_factory=list)  # (recorded, measured)

    @property
    def ok(self) -> bool:
        return self.first is None


def execute_replay(
    events_or_path: str | Path | Iterable[Event],
    make_executor: Callable[[Header], Executor] | Executor,
    *,
    stop_at_first: bool = True,
    progress: Any = None,
) -> ExecuteReport:
    """Run every recorded step on an executor; compare sampled tokens with the log's."""
    is_path = isinstance(events_or_path, str | Path)
    events = read_log(events_or_path) if is_path else events_or_path
    try:
        policy = LoggedPolicy(events)
    except LogError as e:
        raise LogError(f"{events_or_path}: {e}" if is_path else str(e)) from None
    executor = make_executor if hasattr(make_executor, "execute") else make_executor(policy.header)
    report = ExecuteReport()
    for logged in policy.steps():
        plan, ev = logged.plan, logged.event
        result = executor.execute(plan, policy.requests)
        report.steps += 1
        report.durations.append((ev.end - ev.start, result.duration))
        if progress is not None:
            progress.update(1)
        sampled = [s for s in plan.spans if s.sample]
        if len(result.token_ids) != len(sampled):
            div = Divergence(ev.step, -1, -1, [len(ev.tokens)], [len(result.token_ids)],
                             f"executor returned {len(result.token_ids)} token lists for "
                             f"{len(sampled)} sampling spans")
            report.mismatched_steps += 1
            report.first = report.first or div
            if stop_at_first:
                break
            continue
        bad = None
        for span, want, got in zip(sampled, ev.tokens, result.token_ids):
            report.compared_tokens += len(want)
            if list(got[: len(want)]) != list(want) and bad is None:
                bad = (span, want, list(got))
        if bad is not None:
            report.mismatched_steps += 1
            if report.first is None:
                span, want, got = bad
                report.first = Divergence(ev.step, span.request_id, span.start + span.num_tokens, list(want),
                                          got, _context(policy, plan, span, want, got))
            if stop_at_first:
                break
    return report


def _context(policy: LoggedPolicy, plan, span, want, got) -> str:
    req = policy.requests[span.request_id]
    tokens = req.token_ids.tolist()
    n_prompt = req.num_prompt_tokens
    lines = [
        f"step {plan.step}: {len(plan.spans)} spans "
        + " ".join(f"[r{s.request_id} {s.start}+{s.num_tokens}{'*' if s.sample else ''}]" for s in plan.spans[:12])
        + (" ..." if len(plan.spans) > 12 else ""),
        f"request {span.request_id}: prompt {n_prompt} tokens, {len(tokens) - n_prompt} output tokens so far, "
        f"params {req.params}",
        f"  last tokens: {tokens[-8:]}",
        f"  expected {list(want)} at position {span.start + span.num_tokens}, got {got}",
        f"  block table: {plan.block_tables[plan.spans.index(span)]}",
    ]
    return "\n".join(lines)


def render_execute_report(report: ExecuteReport) -> str:
    lines = [f"steps executed: {report.steps:,}   tokens compared: {report.compared_tokens:,}   "
             f"mismatched steps: {report.mismatched_steps:,}"]
    if report.durations:
        rec = sum(d[0] for d in report.durations)
        got = sum(d[1] for d in report.durations)
        lines.append(f"step time: recorded {rec:.3f} s, measured {got:.3f} s")
    if not report.steps:
        lines.append("nothing compared: no steps")
    elif report.first is None:
        lines.append("tokens match the log")
    else:
        d = report.first
        lines.append(f"FIRST DIVERGENCE at step {d.step}, request {d.request_id}, position {d.position}:")
        lines.append(d.context)
    return "\n".join(lines)
