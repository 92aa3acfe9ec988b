"""StepLoop with overlap: the log (times aside) and the tokens are exactly a sequential run's, for
random configs and workloads (eos, length limits, preemption, chunked prefill, prefix hits), with a
deterministic executor and with the real runner on a tiny model; placeholders are only ever the
inputs of the previous launch's samples."""

from __future__ import annotations

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
from traces.params import SamplingParams

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
