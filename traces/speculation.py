"""What a log's speculative steps say, derived one way for every reader (fold, replay, analysis,
the simulator's acceptance rates).

A speculating span is its request's last token plus ``drafts`` (``Step.drafts``, per sampling
span); its committed ``tokens`` are the drafts it accepted, a prefix of them, and one token more
(the target's own at the first rejected position, or the bonus after the last draft), fewer only
where a stop ended the request inside the round.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from traces.events import Span, Step


def num_accepted(drafts: Sequence[int], tokens: Sequence[int]) -> int:
    """Drafts accepted: how many of the tokens (committed, or sampled at the span's rows) repeat
    the drafts from the first on."""
    n = 0
    for d, t in zip(drafts, tokens):
        if d != t:
            break
        n += 1
    return n


def span_drafts(step: Step) -> list[list[int]]:
    """The drafts of each span of ``step`` (empty for a span that did not speculate)."""
    if not step.drafts:
        return [[] for _ in step.spans]
    it = iter(step.drafts)
    return [next(it) if s.sample else [] for s in step.spans]


def computed_ends(step: Step) -> Iterator[int]:
    """Per span, the request's computed tokens after the step: the span's end, less the drafts it
    rejected (their KV rolled back)."""
    if not step.drafts:
        for s in step.spans:
            yield s.start + s.num_tokens
        return
    k = 0
    for s in step.spans:
        if not s.sample:
            yield s.start + s.num_tokens
            continue
        drafts = step.drafts[k]
        yield _end(s, drafts, step.tokens[k])
        k += 1


def _end(span: Span, drafts: list[int], tokens: list[int]) -> int:
    return span.start + span.num_tokens - len(drafts) + num_accepted(drafts, tokens)


def rounds(step: Step) -> Iterator[tuple[int, int, int]]:
    """(request id, drafts proposed, drafts accepted) of each span of ``step`` that speculated."""
    if not step.drafts:
        return
    k = 0
    for s in step.spans:
        if s.sample:
            drafts = step.drafts[k]
            if drafts:
                yield s.request_id, len(drafts), num_accepted(drafts, step.tokens[k])
            k += 1


def verifying(step: Step) -> set[int]:
    """The requests whose spans in ``step`` verify drafts (what a cost model prices as verify spans)."""
    if not step.drafts:
        return set()
    sampling = (s.request_id for s in step.spans if s.sample)
    return {rid for rid, drafts in zip(sampling, step.drafts) if drafts}
