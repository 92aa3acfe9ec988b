"""StepLoop with overlap: the log (times aside) and the tokens are exactly a sequential run's, for
random configs and workloads (eos, length limits, preemption, chunked prefill, prefix hits), with a
deterministic executor and with the real runner on a tiny model; placeholders are only ever the
inputs of the previous launch's samples."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import PLACEHOLDER
from runtime.serving.llm import LLM
from tests.helpers import SeededTokenExecutor
from tests.model_helpers import make_tiny, one_thread
from tests.test_core_properties import build, configs, requests
from traces.log import read_log
from traces.params import InvalidRequest, SamplingParams

TIMES = ("time", "start", "end")


def untimed(events) -> list[dict]:
    out = []
    for ev in events:
        d = msgspec.to_builtins(ev)
        out.append({k: v for k, v in d.items() if k not in TIMES})
    return out


class OverlappingSeeded(SeededTokenExecutor):
    """launch/collect around the seeded tokens; checks where placeholders may appear."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.previous: set[int] = set()
        self.placeholder_inputs = 0

    def launch(self, plan, requests):
        for s in plan.spans:
            inputs = requests[s.request_id].token_ids[s.start:s.start + s.num_tokens]
            if PLACEHOLDER in inputs:
                assert s.num_tokens == 1 and s.request_id in self.previous
                self.placeholder_inputs += 1
        self.previous = {s.request_id for s in plan.spans if s.sample}
        return self.execute(plan, requests)

    def collect(self, handle):
        return handle


def run_loop(core: EngineCore, executor, overlap: bool) -> None:
    loop = StepLoop(core, executor, lambda: 0.0, overlap=overlap)
    steps = 0
    while core.has_unfinished() or loop.busy:
        outs = loop.step()
        for out in outs:
            assert not out.plan.empty
            core.block_manager.check_invariants()
        steps += 1
        assert steps < 5000


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, reqs=requests, seed=st.integers(0, 5))
def test_overlapped_log_equals_sequential_log(config, reqs, seed):
    logs = []
    for overlap in (False, True):
        events = []
        core, _ = build(config, reqs, events)
        ex = OverlappingSeeded(seed=seed, vocab=50, eos_id=0, eos_every=11)
        run_loop(core, ex, overlap)
        bm = core.block_manager
        assert bm.num_used_blocks == 0 and not bm.tables
        logs.append(untimed(events))
    assert logs[0] == logs[1]


def test_length_only_requests_overlap_every_decode():
    config = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=64), scheduler=SchedulerConfig())
    core, accepted = build(config, [(0, 5, 8, 0, True)] * 3, [])
    ex = OverlappingSeeded()
    run_loop(core, ex, overlap=True)
    assert accepted == 3
    assert ex.placeholder_inputs == 3 * 7  # every decode after the first token reads a placeholder


# --- the real runner on a tiny model -----------------------------------------------------------

MIXED = [
    SamplingParams(max_tokens=29, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=7, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=6, temperature=1.0, top_k=5, logprobs=2, ignore_eos=True),
    SamplingParams(max_tokens=30, temperature=0.0),  # eos may stop it: its steps don't overlap
    SamplingParams(max_tokens=8, temperature=0.7, repetition_penalty=1.3, ignore_eos=True),
    SamplingParams(max_tokens=10, temperature=0.0, min_tokens=4, stop_token_ids=(7,)),
]


@pytest.mark.usefixtures(one_thread.__name__)
def test_real_runner_overlap_matches_sequential(tmp_path):
    tiny = make_tiny("llama", tmp_path / "m", tokenizer=True)
    prompts = [[(7 * i + j) % 300 + 1 for j in range(3 + 5 * i)] for i in range(len(MIXED))] * 2
    params = MIXED * 2
    results = []
    for overlap in (False, True):
        trace = tmp_path / f"log{overlap}.jsonl"
        # a small pool and budget: preemption and chunked prefill happen
        with LLM(str(tiny.folder), device="cpu", block_size=4, num_blocks=24, max_num_batched_tokens=16,
                 max_model_len=128, trace=str(trace)) as llm:
            llm.engine.loop = StepLoop(llm.core, llm.runner, llm.engine.now, overlap=overlap)
            outs = llm.generate(prompts, params, use_tqdm=False)
        events = list(read_log(trace))[1:]
        results.append(([(o.token_ids, o.finish_reason, o.logprobs) for o in outs], untimed(events)))
    (tokens_seq, log_seq), (tokens_ovl, log_ovl) = results
    assert tokens_ovl == tokens_seq
    assert log_ovl == log_seq
    assert any(e["type"] == "Preempted" for e in log_seq)


# --- StepLoop's contract with its caller (LLMEngine): what step() / drain() return, and step times -----


def _core(n=3, events=None):
    config = EngineConfig(cache=CacheConfig(block_size=4, num_blocks=64), scheduler=SchedulerConfig())
    core, _ = build(config, [(0, 5, 4, 0, True)] * n, [] if events is None else events)
    return core


class _Clock:
    """Each reading is one later than the last: step times are readings, so they show which one."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_step_loop_overlaps_by_default_with_an_overlapping_executor():
    loop = StepLoop(_core(), OverlappingSeeded(), _Clock())
    assert loop.step() == [] and loop.busy  # launched, nothing completed yet
    outs = loop.step()
    assert len(outs) == 1 and outs[0].plan.step == 0 and outs[0].result is not None and loop.busy


@pytest.mark.parametrize("overlapping", [True, False], ids=["overlap-off", "no-launch"])
def test_a_sequential_step_loop_completes_every_step_in_the_call(overlapping):
    """overlap=False, or an executor without launch/collect: one completed step per call, never busy."""
    core = _core()
    executor = OverlappingSeeded() if overlapping else SeededTokenExecutor()
    loop = StepLoop(core, executor, _Clock(), overlap=not overlapping)
    steps = []
    while core.has_unfinished():
        (out,) = loop.step()
        assert not loop.busy and out.result is not None and out.plan.step == len(steps)
        steps.append(out)
    assert len(steps) == 4  # the prefill samples token 1, 3 decodes the rest


def test_an_idle_step_loop_returns_one_empty_step():
    """LLMEngine tells idle from stalled by this empty step (requests left or not)."""
    loop = StepLoop(_core(n=0), OverlappingSeeded(), _Clock())
    (out,) = loop.step()
    assert out.plan.empty and out.result is None and out.deltas == [] and not loop.busy


def test_drain_completes_the_step_in_flight():
    core = _core(n=1)
    loop = StepLoop(core, OverlappingSeeded(), _Clock())
    assert loop.drain() == []
    assert loop.step() == []
    (out,) = loop.drain()
    assert out.plan.step == 0 and [d.new_token_ids for d in out.deltas] == [[out.result.token_ids[0][0]]]
    assert not loop.busy and loop.drain() == []
    assert core.requests[0].num_output_tokens == 1


def test_overlapped_steps_tile_the_timeline():
    """A step starts when planned or when the previous one ended (the later), ends when collected."""
    events = []
    core = _core(events=events)
    loop = StepLoop(core, OverlappingSeeded(), _Clock())
    outs = []
    while core.has_unfinished() or loop.busy:
        outs += loop.step()
    steps = [e for e in events if type(e).__name__ == "Step"]
    assert len(steps) == len(outs) == 4
    for step, out in zip(steps, outs):
        assert step.end > step.start and step.end - step.start == out.result.duration
        assert step.end == int(step.end)  # a clock reading: when its tokens were collected
    assert all(b.start == a.end for a, b in zip(steps, steps[1:]))  # each planned before the previous ended


stopping_requests = st.lists(
    st.tuples(st.integers(1, 30), st.integers(1, 20), st.integers(0, 6), st.sets(st.integers(0, 49), max_size=3),
              st.booleans()),  # prompt length, max_tokens, min_tokens, stop token ids, ignore eos
    min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, reqs=stopping_requests, seed=st.integers(0, 5))
def test_overlap_with_stop_tokens_and_min_tokens_equals_sequential(config, reqs, seed):
    """Stop token ids and min_tokens decide which steps may overlap (Request.next_token_matters):
    a step is overlapped only when no token it samples can stop its request."""
    logs = []
    for overlap in (False, True):
        events = []
        core = EngineCore(config, eos_token_id=0, sink=events.append)
        for i, (n, max_tokens, min_tokens, stop_ids, ignore_eos) in enumerate(reqs):
            params = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens),
                                    stop_token_ids=tuple(sorted(stop_ids)), ignore_eos=ignore_eos)
            with contextlib.suppress(InvalidRequest):  # too big for this pool / budget
                core.add_request([100 + 7 * i + j for j in range(n)], params, now=0.0)
        run_loop(core, OverlappingSeeded(seed=seed, vocab=50, eos_id=0, eos_every=11), overlap)
        logs.append(untimed(events))
    assert logs[0] == logs[1]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, reqs=requests, seed=st.integers(0, 5), eos=st.booleans())
def test_tokens_known_at_advance_log_what_commit_logs(config, reqs, seed, eos):
    """A simulator hands ``advance`` the tokens it already knows; ``complete`` then takes a shortcut
    while no token value can end a request. Same log as ``commit``."""
    logs = []
    for known in (False, True):
        events = []
        core, _ = build(config, reqs, events)
        ex = SeededTokenExecutor(seed=seed, vocab=50, eos_id=0 if eos else None, eos_every=11)
        for _ in range(5000):
            if not core.has_unfinished():
                break
            plan = core.schedule(0.0)
            if plan.empty:
                break
            result = ex.execute(plan, core.requests)
            if known and core.overlappable(plan):
                core.advance(plan, result.token_ids)
                assert core.complete(plan, result, 0.0, False) == []
            else:
                core.commit(plan, result, 0.0, False)
            core.block_manager.check_invariants()
        logs.append(untimed(events))
    assert logs[0] == logs[1]
