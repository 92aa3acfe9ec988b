"""Refused requests are counted, not silently left out: the simulator's and the core's Rejected
events reach the summary, the comparison table and the line under each run's title in
``minivllm analyze``."""

from __future__ import annotations

from analysis.frames import frames_from_events, load_frames
from analysis.metrics import render_summary, summarize
from analysis.rejected import reason_kind
from analysis.report import comparison_table
from simulator.cost.cost_model import CostModel
from simulator.sim import simulate
from tests.sim_helpers import small_config
from traces.events import Rejected
from traces.log import LogWriter
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic
from traces.workload import RequestSpec, Workload


class FlatCost(CostModel):
    """10 ms a step plus 0.1 ms a token: enough for latencies to depend on the batch."""

    def step_time(self, step, spans, verifying=()):
        return 0.01 + 1e-4 * sum(s.num_tokens for s in spans)


def workload() -> Workload:
    """10 servable requests and 3 the engine must refuse (over max_model_len = 1024, or over the
    KV pool of 48 blocks of 16)."""
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    specs = [RequestSpec(arrival=0.05 * i, prompt=PromptSynthetic(num_tokens=40 + i, unique_seed=i), params=sp)
             for i in range(10)]
    specs += [RequestSpec(arrival=0.12, prompt=PromptSynthetic(num_tokens=2000, unique_seed=90), params=sp),
              RequestSpec(arrival=0.22, prompt=PromptSynthetic(num_tokens=3000, unique_seed=91), params=sp),
              RequestSpec(arrival=0.32, prompt=PromptSynthetic(num_tokens=1000, unique_seed=92),
                          params=SamplingParams(max_tokens=20, ignore_eos=True))]
    return Workload(sorted(specs, key=lambda s: s.arrival))


def simulated(tmp_path):
    path = tmp_path / "sim.jsonl"
    with LogWriter(path) as log:
        result = simulate(workload(), small_config(num_blocks=48), FlatCost(), sink=log)
    return path, result


def test_the_simulator_logs_what_the_engine_refused(tmp_path):
    path, result = simulated(tmp_path)
    frames = load_frames(path)
    assert len(result.rejected) == 3 and len(frames.rejected) == 3
    assert list(frames.rejected["num_prompt_tokens"]) == [2000, 3000, 1000]
    assert list(frames.rejected["time"]) == [0.12, 0.22, 0.32]
    s = summarize(frames)
    assert (s["requests"], s["finished"], s["rejected"]) == (10, 10, 3)
    assert s["rejected_share"] == 3 / 13
    assert s["rejected_prompt_tokens"] == 6000
    assert s["rejected_reasons"] == {"prompt has N tokens; max_model_len is N": 2,
                                     "prompt + max_tokens = N tokens need N KV blocks; the pool has N "
                                     "(cache.num_blocks)": 1}


def test_the_report_says_how_many_were_rejected_before_anything_else(tmp_path):
    path, _ = simulated(tmp_path)
    frames = load_frames(path)
    text = render_summary(summarize(frames), title="run")
    title, first = text.splitlines()[:2]
    assert title == "run"
    assert first.startswith("!! 3 rejected of 13 requests (23.1%)") and "over the 10 served" in first
    assert "2× prompt has N tokens; max_model_len is N" in first
    assert "13 (10/0/0/3)" in text  # requests (finished/aborted/unfinished/rejected)
    table = comparison_table([("a", frames), ("b", frames)])
    assert "| requests rejected (never served) | 3 | 3 |" in table and "| rejected share | 23.1% | 23.1% |" in table


def test_percentiles_stay_over_the_served_requests(tmp_path):
    """A Rejected event changes no latency: the served requests' numbers are what they were."""
    path, _ = simulated(tmp_path)
    from traces.log import read_log

    events = list(read_log(path))
    with_ = summarize(frames_from_events(events))
    without = summarize(frames_from_events([e for e in events if not isinstance(e, Rejected)]))
    for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        assert with_[key] == without[key]
    assert without["rejected"] == 0 and "rejected" not in render_summary(without).splitlines()[1]


def test_analyze_cli_names_the_rejections(tmp_path, capsys):
    from runtime.cli import main

    path, _ = simulated(tmp_path)
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == ["sim.jsonl", out.splitlines()[1]]
    assert out.splitlines()[1].startswith("!! 3 rejected of 13 requests")


def test_reason_kinds_group_refusals_that_differ_only_in_numbers():
    assert reason_kind("prompt has 5,000 tokens; max_model_len is 4096") == "prompt has N tokens; max_model_len is N"


def test_a_log_whose_every_request_was_refused_is_still_a_report(tmp_path, capsys):
    from runtime.cli import main
    from traces.events import Header

    path = tmp_path / "refused.jsonl"
    with LogWriter(path) as log:
        log(Header(clock="sim"))
        log(Rejected(time=0.0, num_prompt_tokens=9000, params=SamplingParams(), reason="prompt has 9000 tokens; "
                     "max_model_len is 4096"))
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "!! 1 rejected of 1 requests (100.0%)" in out and "1 (0/0/0/1)" in out and "nan" not in out


def test_a_resimulated_log_refuses_what_the_live_one_refused(tmp_path):
    from simulator.replay.replay import resimulate
    from traces.importers.log import read_log_workload

    path, _ = simulated(tmp_path)
    wl = read_log_workload(path)
    assert len(wl) == 13 and wl.meta["rejected"] == 3
    again = tmp_path / "again.jsonl"
    with LogWriter(again) as log:
        result = resimulate(path, FlatCost(), sink=log)
    assert len(result.rejected) == 3
    assert len(load_frames(again).rejected) == 3
