"""``minivllm profile``: a genuine engine log with every step-shape class, a fit from it, and the
CUDA-sized sweep checked for feasibility and length through the engine core (no GPU needed)."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runtime.bench.profile_shapes import FINISH_REASON, ShapeSweep, SweepDrafter, pass_spread, run_sweep
from runtime.cli import main
from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepPlan, StepResult
from simulator.cost.features import FEATURES
from simulator.cost.host_timing import fit_host_timing
from simulator.cost.loading import load_cost_model
from simulator.fitting.fit import CANDIDATES, EXTRAPOLATING
from simulator.fitting.profile_plan import (
    DECODE_HEADROOM,
    DecodeCase,
    PrefillCase,
    derive_limits,
    longest_request,
    sweep_plan,
    warmup_plan,
)
from tests.model_helpers import make_tiny, one_thread
from traces.events import Arrived, Finished, Header, Span, Step, make_header
from traces.log import LogWriter, fold, read_log
from traces.params import SamplingParams
from traces.step_padding import StepPadding

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def shape_class(step: Step) -> str:
    if step.drafts:
        return "verify"
    decode = any(s.num_tokens == 1 for s in step.spans)
    prefill = [s for s in step.spans if s.num_tokens > 1]
    if decode and prefill:
        return "mixed"
    if decode:
        return "decode"
    return "prefill+context" if any(s.start > 0 for s in prefill) else "prefill"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    tiny = make_tiny("llama", tmp / "model")
    log, model = tmp / "profile.jsonl", tmp / "m.json"
    assert main(["profile", "--model", str(tiny.folder), "--device", "cpu", "--quick", "--passes", "2",
                 "--out", str(log), "--fit", str(model), "--holdout-every", "4", "--no-progress"]) == 0
    return log, model


def test_quick_profile_writes_a_genuine_log_with_every_shape_class(quick_run):
    log, _ = quick_run
    events = list(read_log(log))
    header = events[0]
    assert isinstance(header, Header) and header.clock == "wall"
    assert header.extra["dtype"] == "float32" and header.extra["hardware"]
    assert header.extra["profile"]["warmup_steps"] > 0
    steps = [e for e in events if isinstance(e, Step)]
    assert [s.step for s in steps] == list(range(len(steps)))  # warm-up steps are not in the log
    assert {shape_class(s) for s in steps} == {"prefill", "prefill+context", "decode", "mixed", "verify"}
    assert all(s.end > s.start for s in steps)
    assert any(e.reason == FINISH_REASON for e in events if isinstance(e, Finished))
    # its requests sample, as served ones do by default (the API's temperature)
    assert header.extra["profile"]["temperature"] == 1.0
    assert {e.params.temperature for e in events if isinstance(e, Arrived)} == {1.0}
    state = fold(events)  # the block events replay: a consistent engine log
    assert not state.tables


def test_quick_profile_fit(quick_run):
    log, path = quick_run
    doc = json.loads(path.read_text())
    coef = doc["coefficients"]
    assert set(coef) == set(FEATURES) and all(v >= 0 for v in coef.values())
    assert set(doc["features"]) == set(FEATURES)
    # the sweep exercised every feature but the padding, which a CPU run has none of
    assert doc["unfitted_features"] == ["padded_tokens"] and "step_padding" not in doc
    assert math.isfinite(doc["training"]["mape"]) and math.isfinite(doc["heldout"]["mape"])
    assert doc["heldout"]["steps"] > 0 and doc["training"]["logs"] == [str(log)]
    assert doc["command"].startswith("minivllm profile ") and "--quick" in doc["command"]
    # two passes of the sweep, the second checked against the first
    assert doc["profile"]["passes"] == 2 and doc["profile"]["pass_spread"]["cases"] > 0
    assert doc["hardware"] and doc["dtype"] == "float32"
    # every candidate was scored on the held-out steps; the lowest score with a linear part was kept
    scores = doc["selection"]["candidates"]
    assert set(scores) == set(CANDIDATES) and doc["candidate"] == doc["selection"]["chosen"]
    assert scores[doc["candidate"]]["score"] == min(scores[k]["score"] for k in EXTRAPOLATING)
    model = load_cost_model(path)
    if doc["kind"] == "linear":
        assert model.step_time(0, []) == pytest.approx(coef["const"])
    # every step is priced, positive and finite. (Nothing about how a tiny model's prefill grows with
    # its length: its per-token cost, µs, sits below a busy machine's step noise, ms, so which of
    # two short prefills a fit of measured times prices higher depends on the load; the fits' shape
    # is tested on logs of known durations in test_cost_model.py.)
    for n in (8, 64):
        assert 0 < model.step_time(0, [Span(0, 0, n, True)]) < math.inf
    # the ranges the sweep covered, and the host time between its steps
    # (decode rows: 4 decodes, or 4 verify spans of 1 + 8 rows)
    assert doc["ranges"]["max_chunk"][1] >= 64 and doc["ranges"]["decode_seqs"][1] == 4 * 9
    assert doc["host"]["gap_const"] + doc["host"]["gap_per_seq"] > 0 and not doc["host"]["overlap"]


class _ZeroCost:
    def __init__(self) -> None:
        self.steps = 0
        self.classes: set[str] = set()
        self.chunks_on_prefix_beside_decodes = 0  # steps with a prompt's chunk past its start and a decode

    def execute(self, plan, requests):
        self.steps += 1
        if any(s.num_tokens > 1 and s.start > 0 for s in plan.spans) and any(s.num_tokens == 1 for s in plan.spans):
            self.chunks_on_prefix_beside_decodes += 1
        drafts = [plan.drafts.get(s.request_id, []) for s in plan.spans if s.sample] if plan.drafts else []
        self.classes.add(shape_class(Step(step=plan.step, start=0, end=0, spans=plan.spans, tokens=[], drafts=drafts)))
        return StepResult([[151_000] for s in plan.spans if s.sample], 0.0)


def test_cuda_default_sweep_is_feasible_and_short(tmp_path):
    """The sweep of `minivllm profile` on a GPU with serve's default engine (max_model_len 4,096,
    256 sequences, a 2,048-token budget; a ~1M-token KV pool) runs through the real core without a
    stall, stays under 7,000 steps (about a minute on an H100), and its log stays under the 16 MiB a
    device run can send back. As the command builds it: the chunk ladder stops at the 2,048 budget,
    whole prompts go on to max_model_len - 1 (the engine's budget raised to hold them), contexts to
    the engine's max_model_len less decode headroom, batches to max_num_seqs, decode batches at
    long contexts up to the KV pool (a GPU prefills them in seconds)."""
    max_len, max_batch = 4096, 256
    config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=65_536),
                          scheduler=SchedulerConfig(max_model_len=max_len, max_num_batched_tokens=max_len - 1))
    limits = derive_limits(max_len, max_batch, config, budget=2048, max_prefill=max_len - 1, fill_pool=True)
    plan = sweep_plan(limits)
    assert {c.kind for c in plan} == {"prefill", "prefill+context", "decode", "decode (unequal contexts)",
                                      "decode + prefill on a prefix", "verify"}
    decode = [c for c in plan if isinstance(c, DecodeCase) and not c.drafts and not c.spread and not c.mixed_context]
    assert max(c.batch for c in decode) == 256 and max(c.context for c in decode) == max_len - DECODE_HEADROOM
    # whole prompts beyond the budget, up to max_model_len
    assert max(c.chunk for c in plan if isinstance(c, PrefillCase)) == max_len - 1
    # ... at sizes the piecewise graphs pad by several amounts (the padded token's cost, fitted)
    whole = [c.chunk for c in plan if isinstance(c, PrefillCase) and c.chunk > 2048]
    assert len({StepPadding(max_len - 1).padding(n) for n in whole}) >= 3, whole
    # the largest batches decode at every power-of-two context their KV fits, up to the longest
    for batch in (64, 128, 256):
        contexts = sorted(c.context for c in decode if c.batch == batch)
        assert contexts == [ctx for ctx in (32, 64, 128, 256, 512, 1024, 2048, 3584) if batch * ctx <= 2**20 * 0.9]
    # batches of 4 and more also with contexts as unequal as a served batch's (its longest 1.4-3.7 times
    # its mean), the longest one at each context of the grid from 512 on
    unequal = [c for c in plan if isinstance(c, DecodeCase) and c.spread]
    assert {c.batch for c in unequal} == {b for b in {c.batch for c in decode} if b >= 4}
    for c in unequal:
        ctx = c.contexts
        assert len(ctx) == c.batch and max(ctx) == c.context >= 512 and 1.3 <= max(ctx) / (sum(ctx) / len(ctx)) <= 3.7
    # verify spans over contexts of their own reach the longest context a single stream is profiled at
    # (a tree model prices anything past its grid's last context at that context's cost)
    own = [c for c in plan if isinstance(c, DecodeCase) and c.drafts and not c.shared]
    single = max(c.context for c in plan if isinstance(c, DecodeCase) and c.batch == 1 and not c.drafts)
    assert max(c.context for c in own if c.batch == 1) == single
    executor = _ZeroCost()
    run_sweep(ShapeSweep(EngineCore(config, drafter=SweepDrafter(151_936)), executor, vocab_size=151_936),
              warmup_plan(plan, limits), progress=False)
    log = tmp_path / "sweep.jsonl"
    with LogWriter(log) as writer:
        run_sweep(ShapeSweep(EngineCore(config, sink=writer, drafter=SweepDrafter(151_936)), executor,
                             vocab_size=151_936), plan, progress=False)
    assert executor.classes == {"prefill", "prefill+context", "decode", "mixed", "verify"}
    # a prompt's chunks on its cached prefix beside decode batches of 1 to 64, at every prefix context of the grid
    on_prefix = [c for c in plan if isinstance(c, DecodeCase) and c.mixed_context]
    assert {c.batch for c in on_prefix} == {1, 4, 16, 64}
    assert {c.mixed_context for c in on_prefix} == {c.context for c in plan if isinstance(c, PrefillCase) and c.context}
    assert executor.chunks_on_prefix_beside_decodes >= 3 * len(on_prefix)
    assert executor.steps < 7_000
    assert log.stat().st_size < 15 << 20  # a device run sends back files of up to 16 MiB


def test_chunked_prefill_off_limits_contexts_to_the_budget():
    config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=4096),
                          scheduler=SchedulerConfig(max_model_len=4096, max_num_batched_tokens=512,
                                                    enable_chunked_prefill=False))
    limits = derive_limits(4096, 8, config)
    assert limits.max_context <= 512 - 128
    plan = sweep_plan(limits, quick=True)
    run_sweep(ShapeSweep(EngineCore(config, drafter=SweepDrafter(100)), _ZeroCost(), vocab_size=100), plan,
              progress=False)
    assert all(c.chunk + c.context <= limits.max_context for c in plan if isinstance(c, PrefillCase))


class _CountingDrafter(SweepDrafter):
    def __init__(self) -> None:
        super().__init__(100)
        self.calls = 0

    def propose(self, requests, limits):
        self.calls += 1
        return super().propose(requests, limits)


class _SlowerSecondPass:
    """Every step takes 1 s until ``slow_from`` steps have run, then 1.1 s."""

    def __init__(self, slow_from: int) -> None:
        self.slow_from, self.steps = slow_from, 0

    def execute(self, plan, requests):
        self.steps += 1
        return StepResult([[7] for s in plan.spans if s.sample], 1.0 if self.steps <= self.slow_from else 1.1)


def test_pass_spread_compares_each_decode_case_with_its_first_pass():
    config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=512),
                          scheduler=SchedulerConfig(max_model_len=512, max_num_batched_tokens=256))
    plan = [DecodeCase(2, 32, 4), PrefillCase(16), DecodeCase(2, 48, 4, shared=True), DecodeCase(1, 64, 3)]
    first = run_sweep(ShapeSweep(EngineCore(config), _ZeroCost(), vocab_size=100), plan, progress=False)
    executor = _SlowerSecondPass(slow_from=first.steps)
    result = run_sweep(ShapeSweep(EngineCore(config), executor, vocab_size=100), plan * 2, progress=False)
    assert result.case_times[:len(plan)] == [1.0] * len(plan)
    spread = pass_spread(plan, result.case_times)
    # the two plain decode cases; not the prefill, nor the shared prefix (cached by the second pass)
    assert spread.cases == 2 and spread.median == pytest.approx(0.1) and spread.p90 == pytest.approx(0.1)
    assert pass_spread(plan, result.case_times[:len(plan)]) is None  # one pass: nothing to compare


def test_sweep_speculates_only_in_verify_cases():
    """Plain cases are planned as a plain engine plans them (no drafter: the scheduler's decode fast
    path), so their steps' host time is a plain engine's; a verify case's every decode drafts."""
    config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=512),
                          scheduler=SchedulerConfig(max_model_len=512, max_num_batched_tokens=256))
    drafter = _CountingDrafter()
    core = EngineCore(config, drafter=drafter)
    sweep = ShapeSweep(core, _ZeroCost(), vocab_size=100)
    run_sweep(sweep, [DecodeCase(4, 32, 5), PrefillCase(16)], progress=False)
    assert drafter.calls == 0 and core.drafter is None
    run_sweep(sweep, [DecodeCase(4, 32, 5, drafts=2)], progress=False)
    assert drafter.calls == 5 and core.drafter is None
    assert sweep.executor.classes >= {"verify"}


@pytest.mark.parametrize(("flag", "value"), [("--max-batch", "0"), ("--max-context", "0"), ("--holdout-every", "0"),
                                           ("--temperature", "-1"), ("--temperature", "101")])
def test_bad_sweep_flags_name_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--quick", flag, value, "--out", "/dev/null"])
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_resimulating_the_profile_log_reproduces_its_steps(quick_run, tmp_path):
    log, _ = quick_run
    resim = tmp_path / "resim.jsonl"
    assert main(["simulate", str(log), "--cost-model", f"recorded:{log}", "--out", str(resim),
                 "--no-progress"]) == 0
    spans = [[(e.step, e.spans) for e in read_log(p) if isinstance(e, Step)] for p in (log, resim)]
    # the sweep's verify cases come last, drafted by its own drafter, which a plain engine has not
    verify = next(e.step for e in read_log(log) if isinstance(e, Step) and e.drafts)
    assert verify > 0 and spans[0][:verify] == spans[1][:verify]


def test_shipped_cpu_cost_model_loads_by_name():
    model = load_cost_model("smollm2-135m-cpu")
    assert model.meta["provenance"] == "fit" and model.meta["dtype"] == "float32"
    assert model.meta["command"].startswith("minivllm profile") and model.meta["unfitted_features"] == ["padded_tokens"]
    assert model.coefficients["const"] > 0 and math.isfinite(model.meta["heldout"]["mape"])
    lone_decode = model.step_time(0, [Span(0, 100, 1, True)])
    assert 0.01 < lone_decode < 0.2  # SmolLM2 fp32 on 2 CPU cores: tens of ms per decode step
    assert model.defaulted_features == []  # every feature is in the file (padding unexercised: 0)


class _FakeDevice:
    """An overlapping executor on a virtual clock: each step's device work takes ``device`` seconds
    after the step before it; ``launch`` costs the host ``host`` seconds; ``collect`` waits (moves the
    clock) until the step's device work is done, as a GPU's sampled ids reach the host."""

    def __init__(self, clock: list[float], host: float, device: float) -> None:
        self.clock, self.host, self.device = clock, host, device
        self.busy_until = 0.0
        self.launched: list[StepPlan] = []

    def launch(self, plan, requests):
        started = self.clock[0]
        self.clock[0] += self.host
        self.busy_until = max(self.busy_until, self.clock[0]) + self.device
        self.launched.append(plan)
        return plan, started, self.busy_until

    def collect(self, handle):  # the runner's duration: from its launch to the tokens on the host
        plan, started, ready = handle
        self.clock[0] = max(self.clock[0], ready)
        return StepResult([[7] for s in plan.spans if s.sample], ready - started)  # (every draft rejected)

    def execute(self, plan, requests):
        return self.collect(self.launch(plan, requests))


@pytest.mark.parametrize("overlap", [False, True])
def test_the_sweep_steps_the_engine_as_its_live_loop_does(overlap, tmp_path):
    """With overlap (async scheduling) the sweep's steps tile, each logged at the device's pace
    when the device is the slower side; without it each step is host + device. Either way the log
    is a complete run: every case's requests end, fold replays it, the verify steps speculate."""
    config = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=1024),
                          scheduler=SchedulerConfig(max_model_len=1024, max_num_batched_tokens=512))
    clock = [0.0]
    executor = _FakeDevice(clock, host=0.001, device=0.004)
    plan = [PrefillCase(64), DecodeCase(4, 64, 8, (16,)), PrefillCase(32, 64), DecodeCase(2, 48, 4, shared=True),
            DecodeCase(2, 64, 4, shared=True, drafts=2)]
    log = tmp_path / "sweep.jsonl"
    with LogWriter(log) as writer:
        writer(make_header(config, clock="wall", extra={"overlap": overlap, "profile": {}}))
        sweep = ShapeSweep(EngineCore(config, sink=writer, drafter=SweepDrafter(100)), executor, vocab_size=100,
                           clock=lambda: clock[0], overlap=overlap)
        result = run_sweep(sweep, plan, progress=False)
    events = list(read_log(log))
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) == result.steps == len(executor.launched) and not sweep.core.requests
    assert not fold(events).tables and any(s.drafts for s in steps)
    decode = [s for s in steps if shape_class(s) == "decode"]
    tiled = [b.start == a.end for a, b in zip(steps, steps[1:])]
    if overlap:  # the host's 1 ms hides behind the device's 4 ms: decode steps tile at 4 ms
        assert sum(tiled) > len(steps) // 2
        assert statistics.median(s.end - s.start for s in decode) == pytest.approx(0.004)
    else:  # one at a time: host, then device
        assert all(s.end - s.start == pytest.approx(0.005) for s in decode)
    # a model fitted on the sweep simulates the loop as the header says it ran
    assert fit_host_timing([log]).overlap == overlap


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(max_len=st.integers(64, 50_000), chunked=st.booleans(), budget=st.integers(64, 50_000),
       seqs=st.integers(1, 512), blocks=st.integers(64, 200_000), block_size=st.sampled_from([16, 32]),
       max_context=st.integers(1, 60_000), max_batch=st.integers(1, 512),
       max_prefill=st.none() | st.integers(0, 60_000), fill_pool=st.booleans(), quick=st.booleans())
def test_no_case_asks_for_more_than_the_engine_takes(max_len, chunked, budget, seqs, blocks, block_size, max_context,
                                                     max_batch, max_prefill, fill_pool, quick):
    """Whatever the engine's limits, every prompt a sweep case adds is one the engine accepts (no
    prompt of max_model_len or more, none beyond a chunked-off budget), and no decode batch holds
    more sequences than the engine runs at once."""
    config = EngineConfig(cache=CacheConfig(block_size=block_size, num_blocks=blocks),
                          scheduler=SchedulerConfig(max_model_len=max_len, max_num_batched_tokens=budget,
                                                    enable_chunked_prefill=chunked, max_num_seqs=seqs))
    limits = derive_limits(max_context, max_batch, config, max_prefill=max_prefill, fill_pool=fill_pool)
    assume(limits.max_context >= 16)  # (the CLI refuses a smaller engine: "leaves no room for a sweep")
    core = EngineCore(config)
    longest = longest_request(config)
    for case in sweep_plan(limits, quick=quick) + warmup_plan(sweep_plan(limits, quick=quick), limits):
        if isinstance(case, PrefillCase):
            prompts = [(case.context + case.chunk, 1)] + ([(case.context, 1)] if case.context else [])
        else:
            assert case.batch <= seqs
            prompts = [(case.context, max(1, longest - case.context - 1))] + [(c, 1) for c in case.mixed_chunks]
        for n, max_tokens in prompts:
            core.validate(n, SamplingParams(max_tokens=max_tokens, ignore_eos=True))  # raises InvalidRequest
