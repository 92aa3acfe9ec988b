"""Inter-token latency and decode stalls: exact on a hand-made log; a stall is judged against the
run's own median decode step (a CPU run whose every step is slow is not all stalls), or a fixed
``--stall-ms``; on a simulated long prompt arriving during decodes, chunked prefill off makes a
stall in every decoding request and on removes it; ``analyze`` reports them with the step that
made them and says how it judged them."""

from __future__ import annotations

import pytest

from analysis.frames import frames_from_events, load_frames
from analysis.metrics import render_summary, summarize
from analysis.stalls import median_decode_step, stalls
from simulator.cost.cost_model import CostModel
from simulator.sim import simulate
from tests.sim_helpers import small_config
from traces.events import Arrived, Finished, Header, Preempted, Span, Step
from traces.log import LogWriter
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic
from traces.workload import RequestSpec, Workload

SP = SamplingParams(max_tokens=4, ignore_eos=True)


def _arrived(rid, t=0.0, n=8):
    return Arrived(time=t, request_id=rid, prompt=PromptSynthetic(num_tokens=n), params=SP)


def test_gaps_are_between_deliveries_and_a_preemption_is_inside_one():
    """Request 0 gets tokens at 1.0, 1.1, 1.2 and, after a preemption and recompute, 2.0; request 1
    gets two tokens in one span at 1.1 (one delivery), then one at 1.2."""
    log = [Header(clock="sim"), _arrived(0), _arrived(1),
           Step(step=0, start=0.0, end=1.0, spans=[Span(0, 0, 8, True)], tokens=[[5]]),
           Step(step=1, start=1.0, end=1.1, spans=[Span(0, 8, 1, True), Span(1, 0, 8, True)], tokens=[[5], [6, 7]]),
           Step(step=2, start=1.1, end=1.2, spans=[Span(0, 9, 1, True), Span(1, 10, 1, True)], tokens=[[5], [6]]),
           Finished(time=1.2, request_id=1, reason="length", num_output_tokens=3),
           Preempted(time=1.2, step=3, request_id=0),
           Step(step=3, start=1.2, end=1.5, spans=[Span(0, 0, 8, False)], tokens=[]),
           Step(step=4, start=1.5, end=2.0, spans=[Span(0, 8, 3, True)], tokens=[[5]]),
           Finished(time=2.0, request_id=0, reason="length", num_output_tokens=4)]
    f = frames_from_events(log)
    assert list(f.gaps["request_id"]) == [0, 0, 1, 0]
    assert list(f.gaps["step"]) == [1, 2, 2, 4] and list(f.gaps["prev_step"]) == [0, 1, 1, 2]
    assert f.gaps["gap"].tolist() == pytest.approx([0.1, 0.1, 0.1, 0.8])
    s = summarize(f, stall_s=0.5)
    assert s["itl_s"]["max"] == pytest.approx(0.8) and s["itl_s"]["p50"] == pytest.approx(0.1)
    st = s["stalls"]
    assert (st["count"], st["requests"]) == (1, 1)
    (worst,) = st["worst"]
    assert worst == {"request_id": 0, "gap_s": pytest.approx(0.8), "step": 4, "steps_in_gap": 2,
                     "step_prefill_tokens": 3, "step_decode_seqs": 0, "step_duration_s": pytest.approx(0.5),
                     "gap_prefill_tokens": 11}
    assert "a gap of 2 steps: 11 prefill tokens in them" in render_summary(s)


class PrefillHeavyCost(CostModel):
    """10 ms a step + 1 ms a token: a 900-token prompt prefilled whole takes ~0.9 s."""

    def step_time(self, step, spans, verifying=()):
        return 0.01 + 1e-3 * sum(s.num_tokens for s in spans)


def long_prompt_during_decodes() -> Workload:
    short = SamplingParams(max_tokens=30, ignore_eos=True)
    specs = [RequestSpec(arrival=0.0, prompt=PromptSynthetic(num_tokens=32, unique_seed=i), params=short)
             for i in range(4)]
    specs.append(RequestSpec(arrival=0.1, prompt=PromptSynthetic(num_tokens=900, unique_seed=9),
                             params=SamplingParams(max_tokens=2, ignore_eos=True)))
    return Workload(specs)


def _simulate(path, chunked: bool):
    config = small_config(chunked=chunked, budget=128 if chunked else 1024)
    with LogWriter(path) as log:
        simulate(long_prompt_during_decodes(), config, PrefillHeavyCost(), sink=log)
    return path


@pytest.fixture
def on_off(tmp_path):
    return _simulate(tmp_path / "off.jsonl", False), _simulate(tmp_path / "on.jsonl", True)


class SlowCpuCost(CostModel):
    """Every decode step 250 ms, a step with prefill 600 ms (a small model on a CPU)."""

    def step_time(self, step, spans, verifying=()):
        return 0.6 if any(s.num_tokens > 1 for s in spans) else 0.25


def test_the_stall_threshold_is_relative_to_the_runs_own_decode_step(tmp_path):
    """Every gap of a CPU run exceeds 200 ms: a fixed threshold calls each one a stall; 5 × its
    median decode step (250 ms) calls none, and says so."""
    path = tmp_path / "cpu.jsonl"
    with LogWriter(path) as log:
        simulate(long_prompt_during_decodes(), small_config(chunked=True, budget=128), SlowCpuCost(), sink=log)
    frames = load_frames(path)
    assert median_decode_step(frames.steps) == pytest.approx(0.25)
    fixed = stalls(frames, 0.2)
    assert fixed["count"] == len(frames.gaps) and fixed["rule"] == "fixed"
    relative = stalls(frames)
    assert relative["threshold_s"] == pytest.approx(1.25) and relative["count"] == 0
    assert relative["rule"] == "5 × median decode step 250.0 ms" and relative["factor"] == 5
    assert "decode stalls (gaps > 1,250 ms = 5 × median decode step 250.0 ms): none" in render_summary(
        summarize(frames))
    assert stalls(frames, factor=2)["count"] == (frames.gaps["gap"] > 0.5).sum() > 0  # the prefill steps


def test_chunked_prefill_off_stalls_every_decode_and_on_does_not(on_off):
    off, on = (summarize(load_frames(p), stall_s=0.2) for p in on_off)
    st = off["stalls"]
    assert (st["count"], st["requests"]) == (4, 4)
    assert {(w["step_prefill_tokens"], w["step_decode_seqs"]) for w in st["worst"]} == {(900, 4)}
    assert off["itl_s"]["max"] == pytest.approx(0.914)
    assert on["stalls"]["count"] == 0 and on["itl_s"]["max"] < 0.2
    # TPOT averages the stall away: its p50 barely tells the two apart
    assert off["tpot_s"]["p50"] < 0.1


def test_analyze_reports_stalls_with_a_threshold_flag_and_the_ab_config_differences(on_off, capsys):
    from runtime.cli import main

    off, on = on_off
    assert main(["analyze", str(off), str(on), "--labels", "off,on", "--stall-ms", "200"]) == 0
    out = capsys.readouterr().out
    assert "decode stalls (gaps > 200 ms): 4 in 4 requests" in out
    assert "which ran 900 prefill tokens + 4 decodes in 914 ms" in out
    assert "decode stalls (gaps > 200 ms): none" in out  # the chunked run
    assert "| decode stalls (gaps > stall threshold) | 4 | 0 | -100.0% |" in out
    assert "| stall threshold (ms) | 200.0 | 200.0 | +0.0% |" in out
    assert "Decode stall: a gap between two tokens of a request longer than 200 ms." in out
    diff = out[out.index("config differences (off → on):"):].splitlines()
    assert diff[1:3] == ["  scheduler.max_num_batched_tokens: 1,024 → 128",
                         "  scheduler.enable_chunked_prefill: off → on"]
    assert out.index("config differences") < out.index("| metric |")
    assert main(["analyze", str(off), "--stall-ms", "2000"]) == 0
    assert "decode stalls (gaps > 2,000 ms): none (longest gap 914 ms)" in capsys.readouterr().out


def test_stall_ms_must_be_positive(on_off, capsys):
    from runtime.cli import main

    with pytest.raises(SystemExit) as e:
        main(["analyze", str(on_off[0]), "--stall-ms", "0"])
    assert e.value.code == 2 and "--stall-ms: must be > 0" in capsys.readouterr().err


def test_no_gaps_no_stalls():
    f = frames_from_events([Header(clock="sim"), _arrived(0)])
    st = stalls(f)
    assert st["count"] == 0 and st["worst"] == []
