"""Speculative decoding in the engine core: budgets, KV roll-back, stops on the committed stream,
the log (fold after every step, byte round trip, replay), against a deterministic target."""

from __future__ import annotations

import pytest

from runtime.engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.drafters import MatchOdds, NgramDrafter, parse_speculative
from simulator.replay.policy import LoggedPolicy
from tests.helpers import OracleDrafter, VerifyingExecutor, run_checked
from traces.events import BlockTrimmed, Step
from traces.log import LogWriter, read_log
from traces.params import SamplingParams
from traces.speculation import rounds

TARGET = VerifyingExecutor(vocab=50)


def engine(events=None, drafter=None, num_blocks=64, budget=32, eos=None, speculative="ngram:4"):
    cfg = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=num_blocks),
                       scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_model_len=128),
                       speculative=speculative)
    return EngineCore(cfg, eos_token_id=eos, sink=None if events is None else events.append, drafter=drafter)


def outputs(core):
    done = {}
    seen = set()

    def on_step(out):
        for d in out.deltas:
            done.setdefault(d.request_id, []).extend(d.new_token_ids)
            seen.add(d.request_id)
    return done, on_step


def run(core, prompts, params, events):
    for p in prompts:
        core.add_request(p, params, 0.0)
    done, on_step = outputs(core)
    run_checked(core, TARGET, events, on_step=on_step)
    return done


PROMPTS = [[i % 7 + 1 for i in range(n)] for n in (5, 9, 13, 3, 17, 6)]


@pytest.mark.parametrize("rate", [0.0, 0.5, 0.9, 1.0])
def test_speculation_commits_what_the_target_would_alone(rate):
    """Whatever the drafts, a greedy target's output is the same with and without speculation; the
    block manager's invariants and fold(log) == live state hold after every step (run_checked)."""
    params = SamplingParams(max_tokens=23, ignore_eos=True)
    plain = run(engine(speculative=""), PROMPTS, params, None)
    events = []
    spec = run(engine(events, OracleDrafter(TARGET, 4, rate)), PROMPTS, params, events)
    assert spec == plain
    proposed = accepted = 0
    for ev in events:
        if isinstance(ev, Step):
            for _, p, a in rounds(ev):
                proposed, accepted = proposed + p, accepted + a
    assert proposed > 0
    assert (accepted == 0) == (rate == 0.0) and (accepted == proposed) == (rate == 1.0)
    steps = sum(isinstance(e, Step) for e in events)
    if rate == 1.0:  # 1 + 4 tokens a round: 23 tokens in 5 rounds (+ the prefill's first)
        assert steps < 12
    assert any(isinstance(b, BlockTrimmed) for e in events if isinstance(e, Step) for b in e.block_events) == (
        0 < rate < 1 or rate == 0.0)


def test_the_budget_holds_the_drafts():
    """Each speculating decode takes 1 + drafts of the step's budget; drafts are cut to what is left."""
    events = []
    core = engine(events, OracleDrafter(TARGET, 8, 1.0), budget=10)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    done = run(core, PROMPTS[:3], params, events)
    for ev in events:
        if isinstance(ev, Step):
            assert sum(s.num_tokens for s in ev.spans) <= 10
    assert done == run(engine(speculative=""), PROMPTS[:3], params, None)


def test_drafts_never_run_past_max_tokens():
    events = []
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    done = run(engine(events, OracleDrafter(TARGET, 8, 1.0)), PROMPTS, params, events)
    assert all(len(v) == 7 for v in done.values())


def test_an_eos_inside_the_accepted_drafts_stops_there():
    """The committed stream stops at its first stop token: the drafts after it are dropped."""
    eos = next(t for t in range(50) if any(TARGET.token(0, p) == t for p in range(8, 20)))
    params = SamplingParams(max_tokens=40)
    plain = run(engine(speculative="", eos=eos), PROMPTS[:1], params, None)
    events = []
    spec = run(engine(events, OracleDrafter(TARGET, 6, 1.0), eos=eos), PROMPTS[:1], params, events)
    assert spec == plain and plain[0][-1] == eos


def test_logs_round_trip_and_replay(tmp_path):
    """A speculative log reads back to the same events, and the replayed plans carry the drafts."""
    events = []
    params = SamplingParams(max_tokens=15, ignore_eos=True)
    core = engine(events, OracleDrafter(TARGET, 3, 0.6))
    from traces.events import make_header
    events.append(make_header(core.config, clock="sim"))
    events.insert(0, events.pop())
    run(core, PROMPTS, params, events)
    path = tmp_path / "spec.jsonl"
    with LogWriter(path) as w:
        for ev in events:
            w(ev)
    back = list(read_log(path))
    assert back[1:] == events[1:]
    assert back[0].config["speculative"] == "ngram:4"
    replayed = list(LoggedPolicy(iter(back)).steps())
    recorded = [e for e in events if isinstance(e, Step)]
    assert [s.plan.spans for s in replayed] == [e.spans for e in recorded]
    assert any(s.plan.drafts for s in replayed)


def test_ngram_drafter_looks_up_what_followed_the_latest_match():
    d = NgramDrafter(3)
    assert d.lookup([1, 2, 3, 9, 9, 1, 2, 3, 7, 1, 2, 3], 3) == (3, [7, 1, 2])  # the latest [1, 2, 3]
    assert d.lookup([5, 6, 7, 8], 3) == (0, [])
    assert d.lookup([256, 1, 0, 0, 1], 2) == (0, [])  # 1's bytes inside 256's are no token match
    assert d.lookup([4, 5, 4, 5], 4) == (2, [4, 5])


@pytest.mark.parametrize("text", ["ngram", "ngram:0", "ngram:17", "model:4", "eagle:3", "ngram:x:3"])
def test_bad_speculative_values_name_the_field(text):
    with pytest.raises(ConfigError, match="^speculative "):
        EngineConfig(speculative=text)


def test_speculative_specs():
    assert parse_speculative("off") is None
    assert str(parse_speculative("model:/a:b/draft:5")) == "model:/a:b/draft:5"
    assert "speculative" not in EngineConfig().to_dict()


def test_ngram_drafter_leaves_a_request_alone_while_its_drafts_are_rejected():
    """Text that does not repeat itself gets few drafts (each costs compute); repetitive text keeps them."""
    from array import array

    from runtime.engine.request import Request

    d = NgramDrafter(4)
    loop = Request(0, array("i", [1, 2, 3, 4] * 4), SamplingParams(max_tokens=64), 0.0, 256)
    other = Request(1, array("i", [1, 2, 3, 4] * 4), SamplingParams(max_tokens=64), 0.0, 256)
    got = {0: 0, 1: 0}
    for step in range(40):
        drafts = d.propose([loop, other], [4, 4])
        got[0] += bool(drafts[0])
        got[1] += bool(drafts[1])
        loop.token_ids.extend(drafts[0][:2] or [1])  # accepted
        other.token_ids.extend([100 + step, 1, 2])  # [1, 2] recurs, what follows it never does
    assert got[0] == 40 and got[1] < 8, got
    assert sum(bool(NgramDrafter(4).propose([other], [4])[0]) for _ in range(3)) == 3  # without odds: each


def test_ngram_drafts_go_as_far_as_their_match_lengths_odds():
    """Continuations are scored per match length whether verified or not: once two-token matches
    have come out wrong, one proposes nothing, while the first longer match of a new loop drafts."""
    from array import array

    from runtime.engine.request import Request

    d = NgramDrafter(4)
    req = Request(0, array("i", [1, 2, 3, 4] * 4), SamplingParams(max_tokens=200), 0.0, 256)
    for step in range(12):  # [.., 1, 2] recurs, what follows never does
        d.propose([req], [4])
        req.token_ids.extend([100 + step, 1, 2])
    assert d.odds.length(2, 4) == 0 and d.odds.length(3, 4) == 4
    loop, drafted_at = [7, 8, 9, 10, 11], None
    for step in range(20):  # now the text loops: one token a step, as a plain decode commits
        if d.propose([req], [4])[0] and drafted_at is None:
            drafted_at = step
        req.token_ids.append(loop[step % len(loop)])
    # the loop's first match ([7, 8], once 7 comes round) is a two-token one: nothing; the next is
    # [7, 8, 9]
    assert drafted_at == len(loop) + 3, drafted_at
    assert d.odds.length(3, 4) == 4 and d.odds.kept[3][3] > 0  # (scored: the loop's continuations came true)


def test_match_odds_cut_a_proposal_where_its_odds_of_being_kept_fall_below_the_floor():
    odds = MatchOdds((2,), 4, min_keep=0.3)
    assert odds.length(2, 4) == 4  # the prior: 0.75, 0.56, 0.42, 0.32
    for _ in range(20):
        odds.score(2, 1, 2)  # the first position kept, the second wrong
    assert odds.length(2, 4) == 1 and odds.length(2, 0) == 0
    for _ in range(60):
        odds.score(2, 0, 1)  # now the first wrong: the latest scores weigh more
    assert odds.length(2, 4) == 0


def test_the_ngram_drafter_is_lossless_and_writes_the_same_log_twice(tmp_path):
    """The real drafter (its odds learned as it goes) against a greedy target: the plain output, a
    log that fold checks after every step, and the same bytes on a second run."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = run(engine(speculative=""), PROMPTS, params, None)
    logs = []
    for i in range(2):
        events = []
        assert run(engine(events), PROMPTS, params, events) == plain
        assert sum(p for ev in events if isinstance(ev, Step) for _, p, _ in rounds(ev)) > 0
        path = tmp_path / f"run{i}.jsonl"
        with LogWriter(path) as write:
            for ev in events:
                write(ev)
        logs.append(path.read_bytes())
    assert logs[0] == logs[1]
