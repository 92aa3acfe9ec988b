
import pytest

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.request import RequestStatus
from runtime.engine.types import StepResult
from tests.helpers import SeededTokenExecutor, run_checked
from traces.block_runs import num_blocks
from traces.events import Aborted, Admitted, Arrived, Finished, Header, PrefixHit, Rejected, Step
from traces.log import LogWriter, encode, fold, read_log
from traces.params import InvalidRequest, SamplingParams
from traces.prompt import TRACE_PROMPTS, PromptIds, PromptSynthetic

EX = SeededTokenExecutor()


def engine(num_blocks=32, budget=16, events=None, eos=None, trace_prompts="ids", **sched):
    cfg = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=num_blocks),
                       scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_model_len=128, **sched))
    return EngineCore(cfg, eos_token_id=eos, sink=None if events is None else events.append,
                      trace_prompts=trace_prompts)


def test_request_ids_come_from_a_per_engine_counter():
    a, b = engine(), engine()
    assert [a.add_request([1, 2], SamplingParams(), 0.0) for _ in range(3)] == [0, 1, 2]
    assert b.add_request([1, 2], SamplingParams(), 0.0) == 0


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], SamplingParams(), "prompt must contain at least one token"),
        (list(range(200)), SamplingParams(), "prompt has 200 tokens; max_model_len is 128"),
        (list(range(128)), SamplingParams(), "prompt has 128 tokens; max_model_len is 128"),  # no room to sample
        (list(range(100)), SamplingParams(max_tokens=21),
         "prompt + max_tokens = 121 tokens need 31 KV blocks; the pool has 20 (cache.num_blocks)"),
    ],
)
def test_requests_that_can_never_run_are_rejected(prompt, params, message):
    """Rejected up front, with a message an HTTP client can act on (the API's 400 error)."""
    core = engine(num_blocks=20)
    with pytest.raises(InvalidRequest) as err:
        core.add_request(prompt, params, 0.0)
    assert str(err.value) == message
    assert not core.has_unfinished()


def test_a_refused_request_is_logged_as_rejected_and_takes_no_id():
    """The log counts what the engine refused (an analysis that silently drops the longest requests
    reports a flattering TTFT); the accepted requests' ids and events are what they were without it."""
    events = []
    core = engine(num_blocks=20, events=events)
    params = SamplingParams(max_tokens=21)
    with pytest.raises(InvalidRequest) as err:
        core.add_request(list(range(100)), params, 1.5, priority=3)
    assert core.add_request([1, 2], SamplingParams(), 2.0) == 0
    rejected = events[0]
    assert rejected == Rejected(time=1.5, num_prompt_tokens=100, params=params, reason=str(err.value), priority=3,
                                prompt=PromptIds(list(range(100))))
    assert [type(e) for e in events] == [Rejected, Arrived] and events[1].request_id == 0
    assert fold(read_back(events)).computed == {0: 0}  # fold passes over it


def read_back(events):
    """``events`` after a trip through a log file's encoding."""
    import msgspec

    from traces.events import Event

    return [Header(num_blocks=20)] + [msgspec.json.decode(encode(e), type=Event) for e in events]


@pytest.mark.parametrize(("mode", "n", "kept"), [("ids", 200, False), ("ids", 128, True), ("hashes", 200, False),
                                                 ("none", 200, False)])
def test_a_rejected_prompt_is_kept_only_where_an_arrived_one_would_be(mode, n, kept):
    """ids logs keep a refused prompt up to max_model_len tokens (a huge one is its length alone);
    hashes / none logs never keep anyone's token ids."""
    events = []
    core = engine(events=events, trace_prompts=mode)
    with pytest.raises(InvalidRequest):
        core.add_request(list(range(n)), SamplingParams(), 0.0)
    (rejected,) = events
    assert rejected.num_prompt_tokens == n and (rejected.prompt is not None) == kept


def test_the_largest_servable_requests_are_accepted():
    core = engine(num_blocks=32)  # 128 tokens of KV: max_model_len
    core.add_request([7], SamplingParams(max_tokens=1), 0.0)
    core.add_request(list(range(127)), SamplingParams(max_tokens=1000), 0.0)  # capped at max_model_len
    chunked_off = engine(budget=16, enable_chunked_prefill=False)
    chunked_off.add_request(list(range(12)), SamplingParams(max_tokens=4), 0.0)  # 16 = the budget
    with pytest.raises(InvalidRequest) as err:
        chunked_off.add_request(list(range(12)), SamplingParams(max_tokens=5), 0.0)
    assert str(err.value) == ("prompt + max_tokens = 17 tokens exceed scheduler.max_num_batched_tokens=16, which must "
                              "hold a whole (re)computed prompt when chunked prefill is off")
    run_checked(core, EX, None)


@pytest.mark.parametrize("when", ["waiting", "prefilling", "decoding", "preempted"])
def test_abort_at_every_status_frees_everything_and_is_idempotent(when):
    events = []
    core = engine(num_blocks=6, budget=8, events=events)
    victim_of_preemption = None
    a = core.add_request(list(range(1, 13)), SamplingParams(max_tokens=10, ignore_eos=True), 0.0)
    if when == "prefilling":
        core.step(0, EX)
        assert core.requests[a].num_computed_tokens == 8
    elif when == "decoding":
        core.step(0, EX)
        core.step(1, EX)
        assert core.requests[a].num_remaining_tokens == 1
    elif when == "preempted":
        core = engine(num_blocks=6, budget=64, events=events)
        core.add_request(list(range(1, 9)), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
        a = core.add_request(list(range(50, 58)), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
        t = 0
        while core.requests[a].status is not RequestStatus.PREEMPTED:
            core.step(t, EX)
            t += 1
        victim_of_preemption = a
    status = core.requests[a].status
    assert core.abort(a, 5.0)
    assert not core.abort(a, 6.0) and not core.finish(a, 6.0)
    bm = core.block_manager
    bm.check_invariants()
    assert a not in bm.tables and a not in bm.reserved
    if victim_of_preemption is None:
        assert bm.num_used_blocks == 0 and bm.total_reserved == 0, status
    aborted = [e for e in events if isinstance(e, Aborted)]
    assert len(aborted) == 1 and aborted[0].request_id == a
    run_checked(core, EX, None)  # the rest still runs to completion


def test_finish_between_steps_ends_a_request_with_its_reason():
    events = []
    core = engine(events=events)
    a = core.add_request([1, 2, 3], SamplingParams(max_tokens=10), 0.0)
    core.step(0, EX)
    assert core.finish(a, 1.0, "stop")
    fin = [e for e in events if isinstance(e, Finished)]
    assert fin[0].reason == "stop" and fin[0].num_output_tokens == 1 and fin[0].block_events
    assert core.block_manager.num_used_blocks == 0 or core.block_manager.evictable


def test_eos_finishes_and_deltas_report_tokens():
    ex = SeededTokenExecutor(eos_id=3, eos_every=2)
    core = engine(eos=3)
    a = core.add_request([1, 2, 3], SamplingParams(max_tokens=50), 0.0)
    tokens = []
    t = 0
    while core.has_unfinished():
        for d in core.step(t, ex).deltas:
            tokens += d.new_token_ids
            if d.finished:
                assert d.finish_reason == "stop" and d.request_id == a
        t += 1
    assert tokens[-1] == 3 and 3 not in tokens[:-1]


def _workload(core):
    for i in range(15):
        core.add_request([(7 * i + j) % 50 + 1 for j in range(5 + 3 * i % 17)],
                         SamplingParams(max_tokens=3 + i % 7), now=0.1 * i)


def test_identical_inputs_give_byte_identical_logs(tmp_path):
    blobs = []
    for name in ("a.jsonl", "b.jsonl"):
        path = tmp_path / name
        with LogWriter(path) as w:
            w(Header(clock="sim", config=EngineConfig().to_dict(), num_blocks=24, block_size=4))
            core = engine(num_blocks=24, events=None)
            core.sink = w
            _workload(core)
            run_checked(core, SeededTokenExecutor(seed=5), None)
        blobs.append(path.read_bytes())
    assert blobs[0] == blobs[1] and len(blobs[0]) > 1000


def test_log_round_trips_and_folds_to_the_final_state(tmp_path):
    path = tmp_path / "run.jsonl.gz"
    events = []
    with LogWriter(path) as w:
        header = Header(clock="sim", num_blocks=24, block_size=4)
        w(header)
        events.append(header)

        def sink(e):
            events.append(e)
            w(e)

        core = engine(num_blocks=24, events=None)
        core.sink = sink
        _workload(core)
        run_checked(core, EX, None)
    back = list(read_log(path))
    assert back == events
    state = fold(back)
    assert state.block_state() == core.block_manager.snapshot() and state.computed == {}
    steps = [e for e in back if isinstance(e, Step)]
    mid = fold(back, upto_step=steps[len(steps) // 2].step)
    assert mid.step == steps[len(steps) // 2].step


LONG = list(range(1, 30))  # seven full blocks of 4 another request could hit


def _prefix_hits(events):
    return [b for e in events if isinstance(e, Step) for b in e.block_events if isinstance(b, PrefixHit)]


@pytest.mark.parametrize(("first", "second", "shared"), [
    ("tenant-a", "tenant-a", True), ("tenant-a", "tenant-b", False), (None, "tenant-a", False),
    ("tenant-a", None, False), (None, None, True),
])
def test_a_cache_salt_decides_who_shares_a_prefix(first, second, shared):
    events = []
    core = engine(num_blocks=32, budget=64, events=events)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    core.add_request(LONG, params, 0.0, cache_salt=first)
    run_checked(core, EX, events)  # fold(log) == live state after every step
    core.add_request(LONG, params, 1.0, cache_salt=second)
    run_checked(core, EX, events)
    assert bool(_prefix_hits(events)) == shared
    arrived = [e for e in events if isinstance(e, Arrived)]
    assert [a.cache_salt for a in arrived] == [first, second]
    for a in arrived:  # no salt: the line is what it always was
        assert (b'"cache_salt"' in encode(a)) == (a.cache_salt is not None)


@pytest.mark.parametrize("salt", ["", 7, "\ud800"])
def test_a_bad_cache_salt_is_an_invalid_request(salt):
    events = []
    core = engine(events=events)
    with pytest.raises(InvalidRequest, match="cache_salt") as err:
        core.add_request([1, 2], SamplingParams(), 0.0, cache_salt=salt)
    assert core.num_requests_added == 0
    assert [(type(e), e.reason) for e in events] == [(Rejected, str(err.value))]  # the salt itself isn't logged


@pytest.mark.parametrize("mode", TRACE_PROMPTS)
def test_trace_prompts_decides_what_the_log_keeps_of_a_prompt(mode):
    a = list(range(1, 12))  # two full blocks of 4 + 3 tokens
    b = a[:8] + [50, 51]  # a's two full blocks + its own tail
    c = [9] * 12
    runs = {}
    for m in ("ids", mode):
        events = []
        core = engine(num_blocks=32, budget=64, events=events, trace_prompts=m)
        for i, p in enumerate((a, b, c, a)):
            core.add_request(p, SamplingParams(max_tokens=3, ignore_eos=True), 0.1 * i,
                             cache_salt="s" if i == 3 else None)
        run_checked(core, EX, events)
        runs[m] = events
    # the engine ran on the token ids either way: everything but the prompt records is the same
    decisions = {m: [e for e in events if not isinstance(e, Arrived)] for m, events in runs.items()}
    assert decisions[mode] == decisions["ids"]
    prompts = [e.prompt for e in runs[mode] if isinstance(e, Arrived)]
    assert [p.num_tokens for p in prompts] == [11, 10, 12, 11]
    if mode == "ids":
        assert prompts == [PromptIds(p) for p in (a, b, c, a)]
        return
    assert all(isinstance(p, PromptSynthetic) for p in prompts)
    assert len({p.unique_seed for p in prompts}) == 4  # each partial last block its own
    ids = [p.segment_ids for p in prompts]
    if mode == "none":
        assert ids == [[], [], [], []]
        return
    assert all(p.segment_len == 4 for p in prompts) and [len(s) for s in ids] == [2, 2, 3, 2]
    assert ids[0] == ids[1] and ids[2] != ids[0] and ids[3] != ids[0]  # equal prefix ↔ equal ids, per salt
    assert all(0 <= x < 1 << 48 for s in ids for x in s)
    cached = {h & ((1 << 48) - 1) for h in core.block_manager.cache_index}  # the last run's: ``mode``'s
    assert set(ids[0] + ids[2] + ids[3]) <= cached  # the very hashes the prefix cache keyed them by


def test_trace_prompts_must_be_a_known_mode():
    with pytest.raises(ValueError, match="ids, hashes, none"):
        EngineCore(EngineConfig(), trace_prompts="redacted")


def test_abort_and_finish_end_requests_with_their_reasons_and_times():
    """The request state machine's two exits, as the log and the Request object report them."""
    events = []
    core = engine(events=events)
    a, b, c, d = (core.add_request([1 + i, 2, 3], SamplingParams(max_tokens=10), 0.0) for i in range(4))
    core.step(0.0, EX)
    reqs = [core.requests[r] for r in (a, b, c, d)]
    assert core.abort(a, 1.5) and core.finish(b, 2.5)
    assert core.abort(c, 3.5, reason="client disconnected") and core.finish(d, 4.5, reason="stop string")
    assert [(r.status, r.finish_reason) for r in reqs] == [
        (RequestStatus.ABORTED, "abort"), (RequestStatus.FINISHED, "stop"),
        (RequestStatus.ABORTED, "client disconnected"), (RequestStatus.FINISHED, "stop string")]
    ended = [(type(e), e.request_id, e.time, e.reason) for e in events if isinstance(e, Aborted | Finished)]
    assert ended == [(Aborted, a, 1.5, "abort"), (Finished, b, 2.5, "stop"),
                     (Aborted, c, 3.5, "client disconnected"), (Finished, d, 4.5, "stop string")]
    assert not core.has_unfinished()


def test_an_idle_engine_steps_to_an_empty_plan_without_calling_the_executor():
    core = engine()
    ex = SeededTokenExecutor()
    out = core.step(0.0, ex)
    assert out.plan.empty and out.result is None and out.deltas == [] and ex.calls == 0


class TwoTokenExecutor:
    """Two tokens per sampling span (a speculative / jump-forward executor), each with its logprob;
    the token at position p is 10 + p, then 20 + p."""

    def execute(self, plan, requests):
        tokens = [[10 + s.start + s.num_tokens, 20 + s.start + s.num_tokens] for s in plan.spans if s.sample]
        logprobs = [[{t: -0.5 * t} for t in pair] for pair in tokens]
        return StepResult(tokens, 0.5, logprobs)


def test_several_tokens_per_span_are_committed_and_cut_at_a_stop_with_their_logprobs():
    events = []
    core = engine(events=events)
    a = core.add_request([1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=(15,)), 0.0)
    b = core.add_request([4, 5, 6], SamplingParams(max_tokens=5), 0.0)
    ra, rb = core.requests[a], core.requests[b]
    deltas = []
    t = 0.0
    while core.has_unfinished():
        out = core.step(t, TwoTokenExecutor())
        deltas += [(d.request_id, d.new_token_ids, d.finish_reason, d.logprobs) for d in out.deltas]
        t += 1.0

    def lp(*ts):
        return [{x: -0.5 * x} for x in ts]

    assert deltas == [
        (a, [13, 23], None, lp(13, 23)), (b, [13, 23], None, lp(13, 23)),
        (a, [15], "stop", lp(15)),  # the stop token ends it: the token after it is dropped
        (b, [15, 25], None, lp(15, 25)),
        (b, [17], "length", lp(17)),  # 5 tokens: the 6th is dropped
    ]
    assert ra.output_token_ids == [13, 23, 15] and rb.output_token_ids == [13, 23, 15, 25, 17]
    assert [e.tokens for e in events if isinstance(e, Step)] == [[[13, 23], [13, 23]], [[15], [15, 25]], [[17]]]
    fin = [(e.request_id, e.reason, e.num_output_tokens, e.time) for e in events if isinstance(e, Finished)]
    assert fin == [(a, "stop", 3, 1.5), (b, "length", 5, 2.5)]


def test_every_request_ends_with_one_finishing_delta_and_a_finished_request():
    """The last delta of each request carries its finish reason (what LLMEngine reports), the same
    as the log's Finished event and the Request's own state."""
    events = []
    core = engine(num_blocks=64, events=events, eos=3)
    ex = SeededTokenExecutor(seed=2, eos_id=3, eos_every=4)
    reqs = {}
    for i in range(8):
        rid = core.add_request([5 + i, 6, 7], SamplingParams(max_tokens=2 + i, stop_token_ids=(11,) if i % 2 else ()),
                               0.0)
        reqs[rid] = core.requests[rid]
    deltas = {rid: [] for rid in reqs}
    t = 0.0
    while core.has_unfinished():
        out = core.step(t, ex)
        for d in out.deltas:
            deltas[d.request_id].append(d.finish_reason)
        t += 1.0
    finished = {e.request_id: e.reason for e in events if isinstance(e, Finished)}
    assert {rid: ds[-1] for rid, ds in deltas.items()} == finished
    assert all(r is None for ds in deltas.values() for r in ds[:-1])
    assert {rid: (r.status, r.finish_reason) for rid, r in reqs.items()} == {
        rid: (RequestStatus.FINISHED, reason) for rid, reason in finished.items()}
    assert set(finished.values()) == {"stop", "length"}


def test_steps_are_logged_with_their_start_and_end():
    events = []
    core = engine(events=events)
    core.add_request([1, 2, 3], SamplingParams(max_tokens=1), 0.0)
    out = core.step(2.0, SeededTokenExecutor(duration=0.25))
    step, fin = (e for e in events if isinstance(e, Step | Finished))
    assert (step.start, step.end, fin.time) == (2.0, 2.25, 2.25) and out.result.duration == 0.25


@pytest.mark.parametrize("prefix", [True, False])
def test_model_identity_and_hash_salt_root_the_prefix_cache(prefix):
    """Same identity and salt: same block hashes, prompts share KV; another model or salt: none in
    common. With prefix caching off nothing is cached or hit."""

    def run(identity, salt):
        events = []
        cfg = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=32, enable_prefix_caching=prefix, hash_salt=salt),
                           scheduler=SchedulerConfig(max_model_len=128), model_identity=identity)
        core = EngineCore(cfg, sink=events.append)
        for t in range(2):  # the second, identical prompt can hit the first's blocks
            core.add_request(list(range(1, 11)), SamplingParams(max_tokens=1), float(t))
            core.step(float(t), EX)
        blocks = [b for e in events for b in getattr(e, "block_events", ())]
        hit_blocks = sum(num_blocks(b.runs) for b in blocks if isinstance(b, PrefixHit))
        return set(core.block_manager.cache_index), hit_blocks

    (h1, hits), (h1_again, _), (h2, _), (h3, _) = run("m1", ""), run("m1", ""), run("m2", ""), run("m1", "tenant")
    if not prefix:
        assert h1 == h2 == h3 == set() and hits == 0
        return
    assert hits == 2 and len(h1) == 2 and h1 == h1_again
    assert not h1 & h2 and not h1 & h3 and not h2 & h3


def test_arrived_records_the_priority_default_zero():
    events = []
    core = engine(events=events, policy="priority")
    core.add_request([1, 2], SamplingParams(max_tokens=1), 0.0)
    core.add_request([3, 4], SamplingParams(max_tokens=1), 0.0, priority=-1)
    assert [(e.request_id, e.priority) for e in events if isinstance(e, Arrived)] == [(0, 0), (1, -1)]
    assert [s.request_id for s in core.step(0.0, EX).plan.spans] == [1, 0]


def test_a_synthetic_prompt_is_logged_as_given_and_run_on_its_tokens():
    """The simulator and workload replays hand the engine Prompt records: the log keeps the compact
    record, the engine runs on the tokens it stands for."""
    events = []
    core = engine(events=events)
    prompt = PromptSynthetic(num_tokens=9, unique_seed=4)
    rid = core.add_request(prompt, SamplingParams(max_tokens=2), 0.0)
    assert core.requests[rid].num_prompt_tokens == 9
    assert [e.prompt for e in events if isinstance(e, Arrived)] == [prompt]
    run_checked(core, EX, events)


@pytest.mark.parametrize(("mode", "kept"), [("ids", True), ("hashes", True), ("none", False)])
def test_a_synthetic_prompt_is_kept_unless_prompts_are_not_traced(mode, kept):
    """A synthetic prompt holds no one's tokens: ``hashes`` keeps it as given; ``none`` keeps only its length."""
    events = []
    core = engine(events=events, trace_prompts=mode)
    prompt = PromptSynthetic(num_tokens=9, unique_seed=4)
    core.add_request(prompt, SamplingParams(max_tokens=1), 0.0)
    (recorded,) = [e.prompt for e in events if isinstance(e, Arrived)]
    assert recorded == (prompt if kept else PromptSynthetic(num_tokens=9, unique_seed=0))


@pytest.mark.parametrize(("salt", "message"), [
    ("", "cache_salt must be a non-empty string, got ''"),
    (7, "cache_salt must be a non-empty string, got 7"),
    ("\ud800", "cache_salt must be valid Unicode text (no lone surrogates)"),
])
def test_a_bad_cache_salt_is_named_in_the_message(salt, message):
    with pytest.raises(InvalidRequest) as err:
        engine().add_request([1, 2], SamplingParams(), 0.0, cache_salt=salt)
    assert str(err.value) == message


def test_a_request_its_log_refused_leaves_nothing_behind_for_the_next_one():
    """A sink (a LogWriter) may refuse an Arrived; the id is then not handed out, and the next request,
    which gets it, must cache its blocks under its own prefix hashes, not the refused prompt's."""
    events, refused = [], []

    def sink(event):
        if isinstance(event, Arrived) and not refused:
            refused.append(event)
            raise ValueError("refused")
        events.append(event)

    core = EngineCore(EngineConfig(cache=CacheConfig(block_size=4, num_blocks=32),
                                   scheduler=SchedulerConfig(max_model_len=128)), sink=sink, trace_prompts="hashes")
    with pytest.raises(ValueError, match="refused"):
        core.add_request([9] * 12, SamplingParams(max_tokens=1), 0.0)
    mine = list(range(1, 13))
    assert core.add_request(mine, SamplingParams(max_tokens=1), 0.0) == 0
    run_checked(core, EX, None)
    assert core.add_request(mine + [50], SamplingParams(max_tokens=1), 1.0) == 1
    core.step(1.0, EX)
    assert [e.num_cached_tokens for e in events if isinstance(e, Admitted)] == [0, 12]


@pytest.mark.parametrize(("mode", "synthetic", "kept"), [
    ("ids", False, True), ("ids", True, True), ("hashes", False, False), ("hashes", True, True),
    ("none", False, False), ("none", True, False),
])
def test_a_rejected_prompt_is_logged_as_trace_prompts_allows(mode, synthetic, kept):
    """Rejected keeps the prompt only where an Arrived would have kept it as given: ids (token ids or
    a synthetic record), hashes (a synthetic record only: it holds no one's tokens); none keeps none."""
    events = []
    core = engine(num_blocks=20, events=events, trace_prompts=mode)
    prompt = PromptSynthetic(num_tokens=100, unique_seed=1) if synthetic else list(range(100))
    with pytest.raises(InvalidRequest):
        core.add_request(prompt, SamplingParams(max_tokens=21), 0.0)
    (rejected,) = events
    expected = prompt if synthetic else PromptIds(prompt)
    assert rejected.num_prompt_tokens == 100 and rejected.prompt == (expected if kept else None)


@pytest.mark.parametrize("end", ["abort", "finish"])
def test_ending_a_request_whose_tokens_do_not_matter_keeps_watching_one_whose_do(end):
    """A stop-token request keeps its steps from being overlapped after another request, whose
    token values never matter, ends (aborted, or finished at its length limit)."""
    core = engine()
    watched = core.add_request([1, 2, 3], SamplingParams(max_tokens=8, stop_token_ids=[7]), 0.0)
    other = core.add_request([4, 5, 6], SamplingParams(max_tokens=1 if end == "finish" else 8), 0.0)
    core.step(0.0, EX)
    if end == "abort":
        assert core.abort(other, 1.0)
    assert other not in core.requests
    plan = core.schedule(1.0)
    assert [s.request_id for s in plan.spans] == [watched] and not core.overlappable(plan)


@pytest.mark.parametrize("num_blocks, requests, expected", [
    # (prompt, max_tokens) each; after the plan both hold 2 + 4 blocks and 2 are free, and each takes
    # a new block at the run's 5th step and every 4th after it (blocks of 4 tokens)
    (8, [(4, 28), (12, 8)], 6),   # the second one's length: 6 steps, whose 2 new blocks just fit
    (8, [(4, 28), (12, 12)], 8),  # length 10, but the 9th step's 2 new blocks do not fit
    (8, [(4, 28), (12, 11)], 8),  # length 9: the same, the last step cut
    (8, [(4, 28), (12, 9)], 7),   # length 7: its steps' blocks fit, the 9th step's would not
    (8, [(4, 28), (12, 2)], 0),   # the second one ends with this plan's token: no run
    (4, [(7, 9), (4, 4)], 1),     # no block free, and the first one needs one at the run's 2nd step
])
def test_a_decode_run_is_the_longest_whose_blocks_fit(num_blocks, requests, expected):
    """``Scheduler.decode_run``: as many steps as every request's length allows and their new blocks fit the
    pool, exactly (a shorter run is only slower; a longer one would take blocks the pool lacks)."""
    core = engine(num_blocks=num_blocks)
    for i, (prompt_len, max_tokens) in enumerate(requests):
        core.add_request(list(range(100 * i + 1, 100 * i + prompt_len + 1)), SamplingParams(max_tokens=max_tokens),
                         0.0)
    core.step(0.0, EX)
    assert core.scheduler.decode_run(core.schedule(1.0)) == expected


def test_a_decode_run_needs_a_plan_of_decodes_only_and_nothing_waiting():
    core = engine(budget=4)
    core.add_request(list(range(1, 7)), SamplingParams(max_tokens=20), 0.0)  # 6 tokens: chunks 4, then 2
    core.step(0.0, EX)
    assert core.scheduler.decode_run(core.schedule(1.0)) == 0  # its last chunk (2 tokens, sampled)
    core = engine()
    core.add_request([1, 2, 3], SamplingParams(max_tokens=20), 0.0)
    core.step(0.0, EX)
    core.add_request([4, 5, 6], SamplingParams(max_tokens=20), 0.0)
    assert core.scheduler.decode_run(core.schedule(1.0)) == 0  # one admitted in this plan
