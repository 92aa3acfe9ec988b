"""analysis.frames / analysis.metrics on a hand-made log with known answers, and bench sim smoke."""

from __future__ import annotations

import pytest

from analysis.frames import frames_from_events, load_frames
from analysis.metrics import render_summary, summarize
from traces.events import Aborted, Admitted, Arrived, Finished, Header, Preempted, Span, Step
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic


def _log():
    p = lambda n: PromptSynthetic(num_tokens=n)
    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    return [
        Header(clock="sim"),
        Arrived(time=0.0, request_id=0, prompt=p(32), params=sp),
        Arrived(time=0.5, request_id=1, prompt=p(48), params=sp),
        Arrived(time=0.6, request_id=2, prompt=p(10), params=sp),
        Admitted(time=1.0, step=0, request_id=0, num_cached_tokens=0, num_reserved_blocks=2),
        Admitted(time=1.0, step=0, request_id=1, num_cached_tokens=16, num_reserved_blocks=2),
        Step(step=0, start=1.0, end=2.0, spans=[Span(0, 0, 32, True), Span(1, 16, 32, True)], tokens=[[5], [6]]),
        Preempted(time=2.0, step=1, request_id=1),
        Step(step=1, start=2.0, end=2.5, spans=[Span(0, 32, 1, True)], tokens=[[5]]),
        Aborted(time=2.6, request_id=2, reason="abort"),
        Step(step=2, start=2.5, end=3.0, spans=[Span(0, 33, 1, True)], tokens=[[5]]),
        Finished(time=3.0, request_id=0, reason="length", num_output_tokens=3),
    ]


def test_frames_and_metrics_of_a_known_log():
    f = frames_from_events(_log())
    r = f.requests.set_index("request_id")
    assert r.loc[0, "first_token"] == 2.0 and r.loc[0, "finish"] == 3.0 and r.loc[0, "status"] == "finished"
    assert r.loc[1, "num_preemptions"] == 1 and r.loc[1, "status"] == "unfinished"
    assert r.loc[2, "status"] == "aborted" and r.loc[1, "num_cached_tokens"] == 16
    assert list(f.steps["duration"]) == [1.0, 0.5, 0.5]
    assert list(f.steps["prefill_tokens"]) == [64, 0, 0] and list(f.steps["decode_seqs"]) == [0, 1, 1]
    assert list(f.steps["num_admitted"]) == [2, 0, 0] and list(f.steps["num_preempted"]) == [0, 1, 0]
    s = summarize(f)
    assert s["ttft_s"]["p50"] == pytest.approx(1.75)  # request 0: 2.0, request 1: 2.0 - 0.5
    assert s["e2e_s"]["mean"] == 3.0 and s["tpot_s"]["mean"] == 0.5  # (3.0 - 2.0) / 2
    assert s["queue_s"]["mean"] == pytest.approx(0.75)
    assert s["prefill_s"]["mean"] == pytest.approx(1.0)  # admitted at 1.0, first tokens at 2.0
    assert "admitted → 1st token" in render_summary(s)
    assert s["prefix_hit_rate"] == pytest.approx(16 / 80)
    assert s["preemptions"] == 1 and (s["finished"], s["aborted"], s["unfinished"]) == (1, 1, 1)
    assert s["makespan_s"] == 3.0 and s["busy_fraction"] == pytest.approx(2 / 3)
    assert s["output_throughput_tok_s"] == pytest.approx(1.0)
    assert "TTFT" in render_summary(s)


def test_load_frames_reads_a_file(tmp_path):
    from traces.log import LogWriter

    path = tmp_path / "l.jsonl.gz"
    with LogWriter(path) as w:
        for ev in _log():
            w(ev)
    assert len(load_frames(path).steps) == 3


def test_bench_sim_smoke(tmp_path, capsys):
    from runtime.cli import main
    from tests.sim_helpers import DATA

    js = tmp_path / "b.json"
    assert main(["bench", "sim", "--trace", str(DATA / "azure_conv_head200.csv"), "--limit", "40",
                 "--out-dir", str(tmp_path), "--no-progress", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "chunked on" in out and "chunked off" in out and "× real" in out
    assert (tmp_path / "sim_chunked_off.jsonl").exists() and js.exists()


def test_undefined_metrics_render_as_a_dash_not_nan(tmp_path):
    """A log whose requests never got a token: no latency to show, and no matplotlib warning."""
    import warnings

    from analysis.report import comparison_table, write_report

    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    frames = frames_from_events([Header(clock="sim"),
                                 Arrived(time=0.0, request_id=0, prompt=PromptSynthetic(num_tokens=8), params=sp)])
    text = render_summary(summarize(frames))
    assert "nan" not in text and "TTFT" in text
    runs = [("cut", frames)]
    assert "nan" not in comparison_table(runs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report(runs, tmp_path / "report")
