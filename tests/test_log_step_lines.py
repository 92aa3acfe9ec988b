"""What a schema-2 Step line leaves out is read back exactly (traces/step_codec.py), and block ids
as runs (traces/block_runs.py) are exact and canonical.

The event sequences are drawn to look like an engine's (admissions, decodes right after the
previous step, plain runs with one token) and to break each thing a line may leave out (a step
number that jumps, a start after a gap, a decode out of order or at another position, a
multi-token sample, a preemption, a flush in the middle of a run): whatever is drawn reads back
equal.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from traces.block_runs import block_ids, extend_runs, num_blocks, runs_of
from traces.events import Admitted, BlockAllocated, BlockFreed, Finished, Header, Preempted, Span, Step
from traces.log import LogWriter, read_log

ids = st.lists(st.integers(-3, 40), max_size=30)


@given(ids, ids)
def test_runs_are_exact_and_canonical(a, b):
    runs = runs_of(a)
    assert block_ids(runs) == a and num_blocks(runs) == len(a)
    assert len(runs) <= 2 * len(a)
    joined = list(runs)
    extend_runs(joined, b)
    assert joined == runs_of(a + b)  # one encoding of a sequence, however it was built


def test_runs_read_as_documented():
    assert runs_of(range(24)) == [0, 24] and runs_of(range(179, 99, -1)) == [179, -80]
    assert runs_of([7]) == [7, 1] and runs_of([5, 6, 4, 3, 9]) == [5, 2, 4, -2, 9, 1]


@st.composite
def logs(draw):
    """A Header and events an engine could write, with draws that defeat each shortcut."""
    events: list = [Header(num_blocks=64)]
    running: dict[int, int] = {}  # request -> computed
    next_rid, step, end = 0, draw(st.integers(0, 3)), 0.0
    for _ in range(draw(st.integers(1, 40))):
        action = draw(st.sampled_from(["admit", "step", "step", "step", "step", "preempt", "finish"]))
        if action == "admit" or not running:
            rid, next_rid = next_rid, next_rid + 1
            running[rid] = draw(st.integers(0, 5))
            events.append(Admitted(time=end, step=step, request_id=rid, num_cached_tokens=running[rid],
                                   num_reserved_blocks=1))
        elif action in ("preempt", "finish"):
            rid = draw(st.sampled_from(sorted(running)))
            del running[rid]
            events.append(Preempted(time=end, step=step, request_id=rid) if action == "preempt" else
                          Finished(time=end, request_id=rid, reason="length", num_output_tokens=1,
                                   block_events=[BlockFreed(rid)]))
        else:
            order = sorted(running) if draw(st.booleans()) else draw(st.permutations(sorted(running)))
            spans = []
            for rid in order:
                if draw(st.integers(0, 5)) == 0:
                    continue  # not scheduled this step
                n = 1 if draw(st.integers(0, 3)) else draw(st.integers(1, 9))
                start = running[rid] + (draw(st.integers(-1, 1)) if draw(st.integers(0, 9)) == 0 else 0)
                sample = draw(st.booleans()) if n > 1 else draw(st.integers(0, 7)) > 0
                spans.append(Span(rid, start, n, sample))
                running[rid] = start + n
            same = draw(st.booleans())
            tokens = [[0] if same else draw(st.lists(st.integers(0, 9), min_size=1, max_size=2))
                      for s in spans if s.sample]
            step = step + 1 if draw(st.integers(0, 9)) else draw(st.integers(0, 100))
            start = end if draw(st.integers(0, 4)) else end + draw(st.floats(-1, 1, allow_nan=False))
            end = start + draw(st.floats(0, 1e-2, allow_nan=False))
            blocks = [BlockAllocated(spans[0].request_id, [step, 1])] if spans and draw(st.integers(0, 5)) == 0 else []
            events.append(Step(step=step, start=start, end=end, spans=spans, tokens=tokens, block_events=blocks))
    return events


@settings(max_examples=300, deadline=None)
@given(logs(), st.data())
def test_any_sequence_of_steps_reads_back_equal(tmp_path_factory, events, data):
    path = tmp_path_factory.mktemp("lines") / "log.jsonl"
    flush_at = data.draw(st.integers(0, len(events)))
    with LogWriter(path) as w:
        for i, ev in enumerate(events):
            if i == flush_at:
                w.flush()  # a run of plain steps ends at a flush
            w(ev)
        assert w.count == len(events)
    assert list(read_log(path)) == events


def test_plain_decode_steps_share_a_line(tmp_path):
    path = tmp_path / "log.jsonl"
    events = [Header(num_blocks=8),
              Admitted(time=0.0, step=0, request_id=0, num_cached_tokens=0, num_reserved_blocks=1)]
    events.append(Step(step=0, start=0.0, end=0.5, spans=[Span(0, 0, 7, True)], tokens=[[0]]))
    events += [Step(step=i, start=i * 0.5, end=(i + 1) * 0.5, spans=[Span(0, 6 + i, 1, True)], tokens=[[0]])
               for i in range(1, 6)]
    with LogWriter(path) as w:
        for ev in events:
            w(ev)
    lines = path.read_text().splitlines()
    assert lines[2:] == ['{"type":"Step","end":0.5,"start":0.0,"spans":[[0,0,7,true]],"tokens":0}',
                         '{"type":"Step","end":[1.0,1.5,2.0,2.5,3.0],"tokens":0}']
    assert list(read_log(path)) == events
