import pytest

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.request import RequestStatus
from tests.helpers import SeededTokenExecutor, run_checked
from traces.events import Admitted, Preempted, Step
from traces.params import SamplingParams


def engine(block_size=4, num_blocks=64, budget=16, max_seqs=8, chunked=True, reserve_full=True,
           policy="fcfs", prefix=True, events=None):
    cfg = EngineConfig(
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                                  enable_chunked_prefill=chunked, reserve_full_prompt=reserve_full,
                                  policy=policy, max_model_len=512),
    )
    return EngineCore(cfg, eos_token_id=None, sink=None if events is None else events.append)


EX = SeededTokenExecutor()


def prompt(n, base=1):
    return [base + i for i in range(n)]


def spans(out):
    return [(s.request_id, s.start, s.num_tokens, s.sample) for s in out.plan.spans]


def test_chunked_prefill_splits_a_long_prompt_by_the_budget():
    core = engine(budget=16)
    core.add_request(prompt(40), SamplingParams(max_tokens=2), 0.0)
    assert spans(core.step(0, EX)) == [(0, 0, 16, False)]
    assert spans(core.step(1, EX)) == [(0, 16, 16, False)]
    assert spans(core.step(2, EX)) == [(0, 32, 8, True)]
    assert spans(core.step(3, EX)) == [(0, 40, 1, True)]
    assert not core.has_unfinished()


def test_a_two_token_prefill_remainder_is_scheduled_whole():
    """Only a request with exactly one token left is a decode; a 2-token remainder is one span of 2."""
    core = engine(budget=16)
    core.add_request(prompt(18), SamplingParams(max_tokens=2), 0.0)
    assert spans(core.step(0, EX)) == [(0, 0, 16, False)]
    assert spans(core.step(1, EX)) == [(0, 16, 2, True)]


def test_decode_first_then_continuing_prefill_then_admission():
    core = engine(budget=16)
    a = core.add_request(prompt(6), SamplingParams(max_tokens=5), 0.0)
    core.step(0, EX)  # a prefilled, now decoding
    b = core.add_request(prompt(30, 100), SamplingParams(max_tokens=2), 0.0)
    assert spans(core.step(1, EX)) == [(a, 6, 1, True), (b, 0, 15, False)]
    c = core.add_request(prompt(5, 200), SamplingParams(max_tokens=2), 0.0)
    # decode a (1) + continue b (15) fill the budget: c waits
    assert spans(core.step(2, EX)) == [(a, 7, 1, True), (b, 15, 15, True)]
    assert core.requests[c].status is RequestStatus.WAITING
    assert spans(core.step(3, EX)) == [(a, 8, 1, True), (b, 30, 1, True), (c, 0, 5, True)]


def test_decodes_after_one_that_needs_a_block_each_take_one_token_of_the_budget():
    """Once a decode needs a new block, the decodes after it are placed one by one (the slow
    loop); each still takes exactly one token of the budget, and the admission gets the rest."""
    core = engine(block_size=4, budget=16)
    a = core.add_request(prompt(4), SamplingParams(max_tokens=5), 0.0)  # its next token opens block 2
    b = core.add_request(prompt(6, 100), SamplingParams(max_tokens=5), 0.0)  # room left in block 2
    core.step(0, EX)
    c = core.add_request(prompt(40, 200), SamplingParams(max_tokens=2), 0.0)
    out = core.step(1, EX)
    assert spans(out) == [(a, 4, 1, True), (b, 6, 1, True), (c, 0, 14, False)]
    assert out.plan.num_scheduled_tokens == 16


def test_admission_stops_when_a_whole_prompt_used_the_last_of_the_budget():
    core = engine(budget=16)
    x = core.add_request(prompt(16), SamplingParams(max_tokens=2), 0.0)
    y = core.add_request(prompt(5, 100), SamplingParams(max_tokens=2), 0.0)
    assert spans(core.step(0, EX)) == [(x, 0, 16, True)]
    assert core.requests[y].status is RequestStatus.WAITING


def test_chunked_off_needs_the_whole_remainder_in_the_remaining_budget():
    core = engine(budget=20, chunked=False)
    a1 = core.add_request(prompt(4), SamplingParams(max_tokens=6), 0.0)
    a2 = core.add_request(prompt(4, 50), SamplingParams(max_tokens=6), 0.0)
    core.step(0, EX)
    b = core.add_request(prompt(19, 100), SamplingParams(max_tokens=1), 0.0)  # 19 > 20 - 2
    c = core.add_request(prompt(3, 200), SamplingParams(max_tokens=1), 0.0)
    out = core.step(1, EX)
    assert spans(out) == [(a1, 4, 1, True), (a2, 4, 1, True)]  # b waits and blocks c (head of line)
    assert core.requests[b].status is RequestStatus.WAITING
    t = 2
    while a1 in core.requests or a2 in core.requests:
        core.step(t, EX)
        t += 1
    assert spans(core.step(t, EX)) == [(b, 0, 19, True)]
    assert c in core.requests


def test_chunked_off_rejects_requests_that_could_never_fit_the_budget():
    core = engine(budget=16, chunked=False)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        core.add_request(prompt(10), SamplingParams(max_tokens=10), 0.0)


def test_max_num_seqs_limits_running_requests():
    core = engine(budget=64, max_seqs=2)
    for i in range(4):
        core.add_request(prompt(3, 10 * i), SamplingParams(max_tokens=3), 0.0)
    core.step(0, EX)
    assert core.num_running == 2 and core.num_waiting == 2


def test_preemption_recomputes_the_most_recently_admitted():
    events = []
    core = engine(block_size=4, num_blocks=6, budget=64, events=events)
    a = core.add_request(prompt(8), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    b = core.add_request(prompt(8, 100), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    core.step(0, EX)  # both prefilled: 2 + 2 blocks held, 2 free
    seen = set()
    t = 1
    while core.has_unfinished():
        out = core.step(t, EX)
        t += 1
        seen.update(out.plan.preempted)
        core.block_manager.check_invariants()
    assert seen == {b}
    names = [type(e).__name__ for e in events]
    assert "Preempted" in names
    # b was re-admitted after a finished and hit its own cached prompt blocks
    readmit = [e for e in events if type(e).__name__ == "Admitted" and e.request_id == b][-1]
    assert readmit.num_cached_tokens > 0
    finished = [e for e in events if type(e).__name__ == "Finished"]
    assert [e.request_id for e in finished] == [a, b]
    assert all(e.num_output_tokens == 8 for e in finished)


def test_no_admission_in_a_step_that_preempted():
    """A step that preempted admits nothing, even a waiting head that would fit budget, slots and KV.

    a and b have the same prompt and are prefilled together, so b's prompt blocks are duplicates of
    a's (cached once, under a's blocks). When a's decode runs out of blocks, b is preempted and goes
    back to the head of the queue; re-admitting it would cost only its last block: its prompt blocks
    hit a's, still referenced. Without the rule b would come straight back in the same step (thrash)."""
    core = engine(block_size=4, num_blocks=6, budget=64, max_seqs=8)
    a = core.add_request(prompt(8), SamplingParams(max_tokens=12, ignore_eos=True), 0.0)
    b = core.add_request(prompt(8), SamplingParams(max_tokens=12, ignore_eos=True), 0.0)
    bm, sched = core.block_manager, core.config.scheduler
    for t in range(40):
        plan = core.schedule(t)
        if plan.preempted:
            break
        core.commit(plan, EX.execute(plan, core.requests), t)
    else:
        pytest.fail("expected a preemption")
    assert plan.preempted == [b]
    assert plan.admitted == [] and [s.request_id for s in plan.spans] == [a]
    head = core.scheduler.waiting.peek()
    assert head.request_id == b
    # b would fit but for the rule: the budget left, a sequence slot and the KV it needs
    hits = bm.probe(head)
    assert len(hits) == 3 and bm.tables[a][:2] == hits[:2]
    assert head.num_tokens - len(hits) * bm.block_size <= sched.max_num_batched_tokens - plan.num_scheduled_tokens
    assert core.num_running < sched.max_num_seqs
    kv_cost = sum(bm.ref_counts[x] == 0 for x in hits) + bm.blocks_for(head.num_tokens) - len(hits)
    assert 0 < kv_cost <= bm.num_available_blocks
    core.commit(plan, EX.execute(plan, core.requests), t)
    out = core.step(t + 1, EX)  # the next step takes it back in
    assert [x.request_id for x in out.plan.admitted] == [b]


def test_priority_policy_admits_by_priority_and_preempts_the_lowest():
    core = engine(budget=64, max_seqs=1, policy="priority")
    low = core.add_request(prompt(3), SamplingParams(max_tokens=1), 0.0, priority=5)
    high = core.add_request(prompt(3, 50), SamplingParams(max_tokens=1), 0.0, priority=0)
    assert spans(core.step(0, EX))[0][0] == high
    assert spans(core.step(1, EX))[0][0] == low

    core = engine(block_size=4, num_blocks=6, budget=64, policy="priority")
    urgent = core.add_request(prompt(8), SamplingParams(max_tokens=8, ignore_eos=True), 0.0, priority=0)
    core.step(0, EX)
    lazy = core.add_request(prompt(8, 100), SamplingParams(max_tokens=8, ignore_eos=True), 0.0, priority=9)
    preempted = set()
    t = 1
    while core.has_unfinished():
        preempted.update(core.step(t, EX).plan.preempted)
        t += 1
    assert preempted == {lazy} and urgent not in preempted


@pytest.mark.parametrize("reserve_full", [True, False])
@pytest.mark.parametrize("chunked", [True, False])
def test_every_request_finishes_and_fold_matches_live(chunked, reserve_full):
    events = []
    core = engine(block_size=4, num_blocks=24, budget=48, chunked=chunked, reserve_full=reserve_full,
                  events=events)
    for i in range(12):
        core.add_request(prompt(3 + (7 * i) % 20, 5 * (i % 3)), SamplingParams(max_tokens=4 + i % 9), 0.0)
    run_checked(core, EX, events)
    assert sum(type(e).__name__ == "Finished" for e in events) == 12


def test_fcfs_puts_a_preempted_request_back_at_the_head_of_the_queue():
    """A request preempted by recompute keeps its place: it is re-admitted before requests that were
    waiting behind it, even one that arrived before the preemption."""
    events = []
    core = engine(block_size=4, num_blocks=6, budget=64, events=events)
    a = core.add_request(prompt(8), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    b = core.add_request(prompt(8, 100), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    core.step(0, EX)
    c = core.add_request(prompt(12, 200), SamplingParams(max_tokens=2, ignore_eos=True), 0.5)  # 3 blocks: waits
    t = 1
    while not any(isinstance(e, Preempted) for e in events):
        core.step(t, EX)
        t += 1
    assert core.requests[c].status is RequestStatus.WAITING
    run_checked(core, EX, None, now=t)
    after = events[next(i for i, e in enumerate(events) if isinstance(e, Preempted)):]
    assert [e.request_id for e in after if isinstance(e, Preempted)] == [b]
    assert [e.request_id for e in after if isinstance(e, Admitted)] == [b, c]
    assert a not in core.requests


def test_num_preemptions_counts_every_preemption_of_a_request():
    """Each request reports how often it was preempted (LLM outputs carry it): the count in the log."""
    events = []
    core = engine(block_size=2, num_blocks=12, budget=64, events=events)
    reqs = {}
    for i in range(6):
        rid = core.add_request(prompt(4, 10 * i), SamplingParams(max_tokens=16, ignore_eos=True), 0.0)
        reqs[rid] = core.requests[rid]
    run_checked(core, EX, events)
    counts = {rid: sum(isinstance(e, Preempted) and e.request_id == rid for e in events) for rid in reqs}
    assert max(counts.values()) >= 2  # some request was preempted more than once
    assert {rid: r.num_preemptions for rid, r in reqs.items()} == counts


def test_an_aborted_waiting_request_is_never_scheduled():
    events = []
    core = engine(budget=64, max_seqs=1, events=events)
    a, b, c = (core.add_request(prompt(3, 10 * i), SamplingParams(max_tokens=3), 0.0) for i in range(3))
    core.step(0, EX)
    assert core.abort(b, 0.5)
    assert core.num_waiting == 1
    run_checked(core, EX, events, now=1.0)
    scheduled = {s.request_id for e in events if isinstance(e, Step) for s in e.spans}
    assert scheduled == {a, c}
    assert [e.request_id for e in events if isinstance(e, Admitted)] == [a, c]


# --- priority policy: victims anywhere in the running order ---------------------------------------


def test_a_decode_preempted_after_it_was_scheduled_gives_its_token_back_to_the_budget():
    """d1 (priority 9) decodes first; d2 then needs a block, and the policy's victim is d1: its token
    goes back to the budget, so p's prefill chunk fills the budget (8 tokens in the step, not 7)."""
    core = engine(block_size=4, num_blocks=13, budget=8, policy="priority")
    d1 = core.add_request(prompt(6), SamplingParams(max_tokens=20, ignore_eos=True), 0.0, priority=9)
    core.step(0, EX)
    d2 = core.add_request(prompt(4, 100), SamplingParams(max_tokens=20, ignore_eos=True), 1.0, priority=0)
    p = core.add_request(prompt(40, 200), SamplingParams(max_tokens=2, ignore_eos=True), 1.0, priority=0)
    assert spans(core.step(1, EX)) == [(d1, 6, 1, True), (d2, 0, 4, True), (p, 0, 3, False)]
    out = core.step(2, EX)  # d2's 5th token needs a block; p's reservation holds the rest of the pool
    assert out.plan.preempted == [d1]
    assert spans(out) == [(d2, 4, 1, True), (p, 3, 7, False)]
    assert out.plan.num_scheduled_tokens == 8


def test_decodes_after_a_preempted_one_still_run():
    """The victim (priority 9) sits between two decodes in the running order: skipping it must not
    skip the decode after it."""
    core = engine(block_size=4, num_blocks=6, budget=16, policy="priority")
    d1 = core.add_request(prompt(7), SamplingParams(max_tokens=10, ignore_eos=True), 0.0, priority=0)
    d2 = core.add_request(prompt(6, 100), SamplingParams(max_tokens=10, ignore_eos=True), 0.0, priority=9)
    core.step(0, EX)
    d3 = core.add_request(prompt(6, 200), SamplingParams(max_tokens=10, ignore_eos=True), 1.0, priority=0)
    assert spans(core.step(1, EX)) == [(d1, 7, 1, True), (d2, 6, 1, True), (d3, 0, 6, True)]
    out = core.step(2, EX)  # the pool is full: d1's 9th token needs a block
    assert out.plan.preempted == [d2]
    assert spans(out) == [(d1, 8, 1, True), (d3, 6, 1, True)]


def test_priority_ties_preempt_the_latest_admitted():
    core = engine(block_size=4, num_blocks=6, budget=64, policy="priority")
    a, b, c = (core.add_request(prompt(8, 100 * i), SamplingParams(max_tokens=4, ignore_eos=True), 0.0, priority=1)
               for i in range(3))
    core.step(0, EX)  # 3 x 2 blocks: the pool is full
    out = core.step(1, EX)
    assert out.plan.preempted == [c] and spans(out) == [(a, 8, 1, True), (b, 8, 1, True)]


# --- admission -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reserve_full", "reserved"), [(True, 6), (False, 2)])
def test_admission_reserves_the_whole_prompt_or_its_first_chunk(reserve_full, reserved):
    events = []
    core = engine(block_size=4, num_blocks=16, budget=8, reserve_full=reserve_full, events=events)
    core.add_request(prompt(24), SamplingParams(max_tokens=1), 0.0)
    core.step(0, EX)
    assert [(e.request_id, e.num_reserved_blocks) for e in events if isinstance(e, Admitted)] == [(0, reserved)]


def test_chunked_off_admits_a_prompt_exactly_as_long_as_the_budget_left():
    core = engine(budget=16, chunked=False)
    a = core.add_request(prompt(1), SamplingParams(max_tokens=2), 0.0)
    b = core.add_request(prompt(15, 100), SamplingParams(max_tokens=1), 0.0)
    out = core.step(0, EX)
    assert spans(out) == [(a, 0, 1, True), (b, 0, 15, True)] and out.plan.num_scheduled_tokens == 16


def test_a_request_reports_the_prompt_tokens_its_admission_found_cached():
    """LLM outputs carry Request.num_cached_tokens: it is what the Admitted event logged."""
    events = []
    core = engine(block_size=4, events=events)
    core.add_request(prompt(9), SamplingParams(max_tokens=1), 0.0)
    core.step(0, EX)
    b = core.add_request(prompt(9) + [50, 51], SamplingParams(max_tokens=3), 1.0)
    core.step(1, EX)
    assert core.requests[b].num_cached_tokens == 8
    assert [e.num_cached_tokens for e in events if isinstance(e, Admitted)] == [0, 8]


def test_priority_ties_are_admitted_in_arrival_order_not_submission_order():
    """Requests can be submitted with earlier arrival times than ones already queued (a replayed
    trace, a batch taken in late): among equal priorities the earlier arrival goes first."""
    core = engine(budget=64, max_seqs=1, policy="priority")
    late = core.add_request(prompt(3), SamplingParams(max_tokens=1), 5.0, priority=1)
    early = core.add_request(prompt(3, 50), SamplingParams(max_tokens=1), 1.0, priority=1)
    assert spans(core.step(0, EX))[0][0] == early
    assert spans(core.step(1, EX))[0][0] == late
