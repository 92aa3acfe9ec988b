"""How a ``Step`` is written: what the events before it say is left out, and read back from them.

Most steps of a busy engine are decodes of the same running requests, one token each, right after
the previous step. So a Step line leaves out
- ``step`` when it is the previous Step's + 1 (the first: 0),
- ``start`` when it is the previous Step's ``end``,
- its leading decode spans: ``decodes`` (absent: all) of the *decoding* requests lead its spans,
  each as ``[request, computed, 1, true]``, and ``spans`` holds the rest. The decoding requests
  are those admitted, not since preempted or ended, whose latest span sampled, in admission order
  (the order the scheduler decodes them in); ``computed`` is where that span ended,
- the list around each sampling span's tokens when it is one token (``[5, [6, 7]]`` is
  ``[[5], [6, 7]]``), and the list itself when every sampling span drew the same one token
  (``"tokens": 0``: each drew ``[0]``, as every simulated step does).

A *plain* step leaves out all but its end and tokens: it decodes every decoding request, one
token each, right after the previous step, and touches no block. Consecutive plain steps with the
same tokens share one line whose ``end`` lists their ends (the writer holds the run until an
event that is not such a step comes, or it is flushed).

``StepCodec`` holds what that takes (previous step, end, running requests) and is fed every
event of the log in order: the writer encodes with one, the reader decodes with another, and
both see the same events, so they agree. The writer checks each thing it leaves out against the
step itself and writes it whenever they differ, so any sequence of events reads back unchanged.
"""

from __future__ import annotations

import math

import msgspec

from traces.events import Aborted, Admitted, BlockEvent, Event, Finished, Preempted, Span, Step
from traces.log_errors import LogError
from traces.speculation import computed_ends

__all__ = ["StepCodec", "StepLine"]


class StepLine(msgspec.Struct, tag="Step", tag_field="type", omit_defaults=True, kw_only=True):
    """A ``Step`` as a line of the log (schema 2)."""

    end: float | list[float]  # a list: a run of plain steps, one end each
    step: int | None = None  # None: the previous Step's + 1
    start: float | None = None  # None: the previous Step's end
    decodes: int | None = None  # leading decode spans, of the decoding requests in order; None: all
    spans: list[Span] = []  # the spans after them
    tokens: int | list[int | list[int]] = []  # per sampling span, an int x for [x]; an int: each drew [x]
    block_events: list[BlockEvent] = msgspec.field(default_factory=list, name="blocks")
    drafts: list[list[int]] = []  # as the Step's (speculative decoding)
    device_time: float | None = msgspec.field(default=None, name="device")  # as the Step's

    @property
    def plain(self) -> bool:
        """Only an end and tokens: a run of such lines with the same tokens can be one line."""
        return (self.step is None and self.start is None and self.decodes is None and not self.spans
                and not self.block_events and not self.drafts and self.device_time is None
                and (self.tokens.__class__ is int or not self.tokens))




def _same(a: float | None, b: float) -> bool:
    """Equal and written alike (0.0 and -0.0 are equal but not the same number)."""
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))  # type: ignore[arg-type]


class StepCodec:
    def __init__(self) -> None:
        self.next_step = 0
        self.last_end: float | None = None
        # admitted requests not since preempted or ended, in admission order: whether their latest
        # span sampled (they decode next), and where it ended
        self.decoding: dict[int, bool] = {}
        self.computed: dict[int, int] = {}
        self._order: list[int] | None = []  # the decoding requests (None: to be listed again)
        # the spans of the last ``carried`` step, not yet in ``computed`` (each request's is its
        # start + 1): the next plain step is checked against them, no dict read or written a span
        self._pending: tuple[Span, ...] | None = None
        self._last_end: float | None = None  # before the last ``carried`` step
        self._last_pending: tuple[Span, ...] | None = None  # and its ``_pending``

    # --- both sides ------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Write the carried steps' spans into ``computed``."""
        computed = self.computed
        for s in self._pending:  # type: ignore[union-attr]
            computed[s.request_id] = s.start + 1
        self._pending = None

    def observe(self, event: Event) -> None:
        """Follow a non-Step event (after it was written or read)."""
        if self._pending is not None:
            self._settle()
        cls = event.__class__
        if cls is Admitted:
            rid = event.request_id  # type: ignore[union-attr]
            if self.decoding.pop(rid, False):  # re-admitted: to the end, as in the scheduler's order
                self._order = None
            self.decoding[rid] = False
            self.computed[rid] = event.num_cached_tokens  # type: ignore[union-attr]
        elif cls is Preempted or cls is Finished or cls is Aborted:
            rid = event.request_id  # type: ignore[union-attr]
            if self.decoding.pop(rid, False):
                self._order = None
            self.computed.pop(rid, None)

    def _stepped(self, step: Step) -> None:
        if self._pending is not None:
            self._settle()
        self.next_step = step.step + 1
        self.last_end = step.end
        decoding, computed = self.decoding, self.computed
        ends = computed_ends(step) if step.drafts else None
        for s in step.spans:
            rid = s.request_id
            end = s.start + s.num_tokens if ends is None else next(ends)
            was = decoding.get(rid)
            if was is not None:
                sample = s.sample
                if was is not sample:
                    decoding[rid] = sample
                    self._order = None
                computed[rid] = end

    def _decoding(self) -> list[int]:
        order = self._order
        if order is None:
            order = self._order = [rid for rid, sampled in self.decoding.items() if sampled]
        return order

    # --- writer ------------------------------------------------------------------------------------

    def line(self, step: Step) -> StepLine:
        """The line of ``step`` (nothing changes: call ``stepped`` once it is written)."""
        if self._pending is not None:
            self._settle()  # (the same state, written out)
        spans = step.spans
        decoding = self._decoding()
        k = 0
        if decoding:
            computed = self.computed
            for rid, s in zip(decoding, spans):
                if s.request_id != rid or s.num_tokens != 1 or s.sample is not True or s.start != computed[rid]:
                    break
                k += 1
        rest = spans[k:] if k else spans
        last_end = self.last_end
        return StepLine(
            end=step.end,
            step=None if step.step == self.next_step else step.step,
            start=None if last_end is not None and _same(last_end, step.start) else step.start,
            decodes=None if k == len(decoding) else k,
            spans=rest,
            tokens=_tokens_out(step.tokens, k, rest),
            block_events=step.block_events,
            drafts=step.drafts,
            device_time=step.device_time,
        )

    def stepped(self, step: Step) -> None:
        """Follow ``step`` once its line is written."""
        self._stepped(step)

    def carried(self, step: Step) -> int | list | None:
        """If ``step`` leaves out all of its spans (it decodes every decoding request and nothing
        else, right after the previous step, one token each), follow it and return its line's
        tokens (an int, or [] when it samples nothing); else None, and nothing changed. Its line is
        then ``StepLine(end, tokens, block_events)``: with no block events, a plain step. (``line``
        says the same, slower: the writer's shortcut for the commonest step.)"""
        start, last_end = step.start, self.last_end
        if (step.step != self.next_step or start != last_end or last_end is None or step.drafts
                or step.device_time is not None or (start == 0.0 and not _same(last_end, start))):
            return None
        spans = step.spans
        decoding = self._order if self._order is not None else self._decoding()
        if len(spans) != len(decoding):
            return None
        tokens = step.tokens
        if tokens:
            first = tokens[0]
            if (len(first) != 1 or first[0].__class__ is not int or len(tokens) != len(spans)
                    or tokens.count(first) != len(tokens)):
                return None
            out = first[0]
        else:
            out = tokens
        pending = self._pending
        if pending is not None:  # the step before was carried too: each span one past its span
            for p, s in zip(pending, spans):
                if (s.request_id != p.request_id or s.start != p.start + 1 or s.num_tokens != 1
                        or s.sample is not True):
                    return None
        else:
            computed = self.computed
            for rid, s in zip(decoding, spans):
                if s.request_id != rid or s.start != computed[rid] or s.num_tokens != 1 or s.sample is not True:
                    return None
        self.next_step += 1
        self._last_end, self.last_end = last_end, step.end
        self._last_pending, self._pending = pending, tuple(spans)  # (a copy: the caller's list may change)
        return out

    def carried_more(self, ends: list[float], before_last: list[Span], last: list[Span]) -> None:
        """Follow ``len(ends)`` more steps like the last ``carried`` one, each one token further on
        (their spans' last two lists given): what as many ``carried`` calls would leave."""
        self.next_step += len(ends)
        self._last_end = ends[-2] if len(ends) > 1 else self.last_end
        self.last_end = ends[-1]
        self._last_pending, self._pending = tuple(before_last), tuple(last)

    def uncarry(self) -> None:
        """Undo the last ``carried`` (its line could not be written)."""
        self._pending = self._last_pending
        self.next_step -= 1
        self.last_end = self._last_end

    # --- reader ------------------------------------------------------------------------------------

    def steps(self, line: StepLine) -> list[Step]:
        """The Steps a line stands for (and follow them)."""
        if line.end.__class__ is not list:
            return [self.step(line, line.end)]  # type: ignore[arg-type]
        if not line.plain:
            raise LogError("a line with a list of ends must hold nothing else but tokens")
        return [self.step(line, end) for end in line.end]  # type: ignore[union-attr]

    def step(self, line: StepLine, end: float) -> Step:
        """The Step a line stands for, with this end (and follow it)."""
        start = self.last_end if line.start is None else line.start
        if start is None:
            raise LogError("the first Step line must give its start")
        decoding = self._decoding()
        k = len(decoding) if line.decodes is None else line.decodes
        if not 0 <= k <= len(decoding):
            raise LogError(f"decodes={line.decodes}, but {len(decoding)} requests are decoding")
        if k:
            computed = self.computed
            spans = [Span(rid, computed[rid], 1, True) for rid in decoding[:k]]
            spans += line.spans
        else:
            spans = line.spans
        tokens = line.tokens
        if tokens.__class__ is int:
            tokens = [[tokens] for s in spans if s.sample]  # type: ignore[list-item]
        else:
            tokens = [[t] if t.__class__ is int else t for t in tokens]  # type: ignore[union-attr,misc]
        step = Step(step=self.next_step if line.step is None else line.step, start=start, end=end, spans=spans,
                    tokens=tokens, block_events=line.block_events, drafts=line.drafts,  # type: ignore[arg-type]
                    device_time=line.device_time)
        self._stepped(step)
        return step


def _tokens_out(tokens: list[list[int]], carried: int, rest: list[Span]) -> int | list[int | list[int]]:
    """A step's tokens as its line writes them (see the module docstring); ``carried`` sampling
    decode spans lead the step, ``rest`` follows them."""
    if not tokens:
        return tokens  # type: ignore[return-value]
    first = tokens[0]
    n = len(tokens)
    if (len(first) == 1 and first[0].__class__ is int and tokens.count(first) == n
            and n == carried + sum(s.sample is True for s in rest)):
        return first[0]
    return [t[0] if len(t) == 1 else t for t in tokens]
