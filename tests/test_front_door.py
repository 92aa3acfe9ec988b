"""The front door's delay: measured by a probe of the served engine (``minivllm profile
--front-door``), fitted by prompt length from the log (``fit_front_door``) and charged by the
simulator's front door to each request."""

from __future__ import annotations

import json

import pytest

from runtime.bench.front_door_probe import STREAM_BATCHES, STREAM_TOKENS
from runtime.cli import main
from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from simulator.cost.front_door_fit import fit_front_door
from simulator.cost.host_timing import HostTiming
from simulator.cost.linear_model import LinearCostModel
from simulator.fitting.served_steps import MIN_STEPS
from simulator.fleet.front_door import FrontDoor
from simulator.sim import simulate
from traces.events import Step, make_header
from traces.log import LogWriter, read_log
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic
from traces.workload import RequestSpec, Workload

CONFIG = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=1024),
                      scheduler=SchedulerConfig(max_model_len=4096, max_num_batched_tokens=4096))
CONST, PER_TOKEN, STEP = 0.002, 1e-6, 0.01


class _Fixed:
    def execute(self, plan, requests):
        return StepResult([[7] for s in plan.spans if s.sample], STEP)


def _probe_log(path, lengths, busy_extra: bool = False, stalls: dict[int, float] | None = None):
    """A served log as the probe writes it: each request arrives at an idle engine and is first
    scheduled ``CONST + PER_TOKEN · tokens`` later. ``busy_extra``: one more request arrives while
    another runs (queued behind a step: not a front-door measurement). ``stalls``: request index ->
    seconds more it waits (a kernel compiled for its new size)."""
    core = None
    with LogWriter(path) as writer:
        writer(make_header(CONFIG, clock="wall"))
        core = EngineCore(CONFIG, sink=writer)
        t = 0.0
        for i, n in enumerate(lengths):
            prompt = PromptSynthetic(num_tokens=n, seed=0, unique_seed=i + 1, vocab_size=100)
            core.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True), t)
            if busy_extra and i == 0:
                core.add_request(PromptSynthetic(num_tokens=50, seed=0, unique_seed=99, vocab_size=100),
                                 SamplingParams(max_tokens=3, ignore_eos=True), t + 0.0001)
            t += CONST + PER_TOKEN * n + (stalls or {}).get(i, 0.0)
            while core.has_unfinished():
                core.step(t, _Fixed())
                t += STEP
            t += 0.05


def test_the_front_door_fit_recovers_the_delay_by_prompt_length(tmp_path):
    log = tmp_path / "probe.jsonl"
    _probe_log(log, [16, 128, 1024, 3000, 64, 2048], busy_extra=True)
    fit = fit_front_door(read_log(log))
    # the request that arrived while another was running is not a measurement of the door
    assert fit.requests == 6 and fit.max_prompt == 3000
    assert fit.intake_delay == pytest.approx(CONST, rel=1e-6) and fit.intake_per_token == pytest.approx(PER_TOKEN)


def test_a_stall_of_the_first_prompt_of_a_size_does_not_move_the_fit(tmp_path):
    """A 5.8 s wait of the first 8,190-token prompt (a probe on an H100 compiled for it) left the
    line at 266 µs a token; the same size's second prompt shows the door."""
    log = tmp_path / "probe.jsonl"
    _probe_log(log, [16, 128, 1024, 4000, 16, 128, 1024, 4000], stalls={3: 5.8})
    fit = fit_front_door(read_log(log))
    assert fit.requests == 8
    assert fit.intake_delay == pytest.approx(CONST, rel=1e-6) and fit.intake_per_token == pytest.approx(PER_TOKEN)


def test_a_length_whose_every_request_stalled_is_left_out_of_the_fit(tmp_path):
    """Both of an H100 probe's 8,190-token prompts waited (36 ms and 2.5 s): kept, that one length set
    the slope at 3.5 µs a token against the other lengths' 0.34."""
    log = tmp_path / "probe.jsonl"
    _probe_log(log, [16, 64, 256, 512, 1024, 2000, 4000, 4000], stalls={6: 0.036, 7: 2.5})
    fit = fit_front_door(read_log(log))
    assert fit.requests == 8 and fit.max_prompt == 4000 and fit.left_out == (4000,)
    assert fit.intake_delay == pytest.approx(CONST, rel=1e-6) and fit.intake_per_token == pytest.approx(PER_TOKEN)


def test_two_stalled_lengths_do_not_hide_each_other(tmp_path):
    """Each length is judged by the shorter ones, so two stalled sizes cannot vouch for each other."""
    log = tmp_path / "probe.jsonl"
    _probe_log(log, [16, 32, 64, 256, 1024, 2000, 3000, 4000], stalls={6: 0.05, 7: 0.08})
    fit = fit_front_door(read_log(log))
    assert fit.left_out == (3000, 4000)
    assert fit.intake_delay == pytest.approx(CONST, rel=1e-6) and fit.intake_per_token == pytest.approx(PER_TOKEN)


def test_a_line_with_no_stall_keeps_every_length(tmp_path):
    """The door's own growth with the prompt is no stall, however steep: every length is fitted."""
    log = tmp_path / "probe.jsonl"
    _probe_log(log, [16, 64, 256, 512, 1024, 2000, 4000])
    fit = fit_front_door(read_log(log))
    assert fit.left_out == ()
    assert fit.intake_delay == pytest.approx(CONST, rel=1e-6) and fit.intake_per_token == pytest.approx(PER_TOKEN)


def test_a_log_with_no_idle_arrival_has_no_front_door_fit(tmp_path):
    log = tmp_path / "empty.jsonl"
    with LogWriter(log) as writer:
        writer(make_header(CONFIG, clock="wall"))
    assert fit_front_door(read_log(log)) is None


def _spec(arrival: float, n: int) -> RequestSpec:
    prompt = PromptSynthetic(num_tokens=n, seed=0, unique_seed=n, vocab_size=100)
    return RequestSpec(arrival=arrival, prompt=prompt, params=SamplingParams(max_tokens=2, ignore_eos=True))


def test_the_simulated_front_door_charges_each_request_its_prompts_delay():
    door = FrontDoor(latency=CONST, per_token=PER_TOKEN)
    specs = [_spec(0.0, 1000), _spec(1.0, 10)]
    assert door.exits(specs) == pytest.approx([CONST + 1000 * PER_TOKEN, 1.0 + CONST + 10 * PER_TOKEN])
    model = LinearCostModel({"const": STEP})
    model = model.with_host(HostTiming(intake_delay=CONST, intake_per_token=PER_TOKEN))
    steps = []
    simulate(Workload(specs), CONFIG, model, sink=lambda e: steps.append(e) if isinstance(e, Step) else None)
    firsts = {}
    for s in steps:
        for span in s.spans:
            firsts.setdefault(span.request_id, s.start)
    assert firsts[0] == pytest.approx(CONST + 1000 * PER_TOKEN) and firsts[1] == pytest.approx(1.0 + CONST + 0.00001)


def test_profile_probes_the_front_door_of_the_served_engine_and_fits_it(tmp_path):
    from tests.model_helpers import make_tiny

    tiny = make_tiny("llama", tmp_path / "m", tokenizer=True)
    log, model = tmp_path / "p.jsonl", tmp_path / "m.json"
    assert main(["profile", "--model", str(tiny.folder), "--device", "cpu", "--num-blocks", "256", "--quick",
                 "--front-door", "6", "--max-model-len", "512", "--out", str(log), "--fit", str(model),
                 "--no-progress"]) == 0
    probe = tmp_path / "p.front_door.jsonl"
    assert sum(1 for e in read_log(probe) if isinstance(e, Step)) >= 6  # a genuine served log
    doc = json.loads(model.read_text())
    # the 6 prompts, and the first of each streamed batch (each found the engine idle)
    assert doc["front_door"]["requests"] == 6 + len(STREAM_BATCHES) and doc["front_door"]["max_prompt"] == 510
    assert doc["host"]["intake_delay"] + doc["host"]["intake_per_token"] * 510 > 0
    # the streamed batches' decode steps, set against the sweep's engine alone (about 31 a batch: a
    # batch's requests may reach the engine a step apart on a busy machine, which moves the count)
    served = doc["served_steps"]
    assert served["steps"] >= max(MIN_STEPS, len(STREAM_BATCHES) * STREAM_TOKENS // 2) and served["factor"] > 0
