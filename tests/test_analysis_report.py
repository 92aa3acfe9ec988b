"""``analyze --out``'s report.md is read in a minute: a one-line conclusion, the key metrics with a
Δ column against the first run, how a stall was judged, only the Header fields that differ (no
"(absent)" rows), a simulation's out-of-range warning; the big CSVs and Chrome traces only when
asked for."""

from __future__ import annotations

import pytest

from analysis.comparison import KEY, delta_pct, markdown_table
from analysis.conclusion import sentence
from analysis.frames import load_frames
from analysis.metrics import summarize
from analysis.report import write_report
from runtime.cli import main
from tests.sim_helpers import DATA
from tests.test_analysis_stalls import on_off  # noqa: F401  (fixture)


def _summary(ttft=(1.0, 1.0), tpot=(1.0, 1.0), e2e=(1.0, 1.0), tput=100.0) -> dict:
    pct = lambda v: {"p50": v[0], "p90": v[1]}  # noqa: E731
    return {"ttft_s": pct(ttft), "tpot_s": pct(tpot), "e2e_s": pct(e2e), "output_throughput_tok_s": tput}


def test_the_conclusion_names_the_biggest_change_and_the_trade_off():
    base = _summary()
    off = _summary(ttft=(1.1, 1.38), tpot=(0.96, 0.99), e2e=(1.05, 1.2), tput=99.0)
    assert sentence("chunked off", off, "live", base) == (
        "chunked off raises TTFT p90 by 38% and lowers TPOT p50 by 4.0% against live")
    same = _summary(ttft=(1.001, 0.999))
    assert sentence("sim", same, "live", base).startswith("sim matches live within 1%")
    slower = _summary(ttft=(1.2, 1.5), e2e=(1.3, 1.1))  # nothing moves the other way: the runner-up
    assert sentence("b", slower, "a", base) == "b raises TTFT p90 by 50% and raises E2E p50 by 30% against a"


def test_delta_is_against_the_first_run_and_undefined_on_a_zero_base():
    assert delta_pct(138.0, 100.0) == pytest.approx(38.0)
    assert delta_pct(1.0, 0.0) != delta_pct(1.0, 0.0)  # NaN
    assert delta_pct(float("nan"), 1.0) != delta_pct(float("nan"), 1.0)


def test_the_key_table_has_a_delta_column_per_later_run(on_off):  # noqa: F811
    off, on = on_off
    summaries = [summarize(load_frames(p)) for p in (off, on, off)]
    table = markdown_table(["off", "on", "off again"], summaries, key=True).splitlines()
    assert table[0] == "| metric | off | on | Δ | off again | Δ |"
    assert len(table) == 2 + len(KEY)
    ttft = next(line for line in table if line.startswith("| TTFT p90"))
    cells = [c.strip() for c in ttft.strip("|").split("|")]
    expected = delta_pct(summaries[1]["ttft_s"]["p90"], summaries[0]["ttft_s"]["p90"])
    assert cells[3] == f"{expected:+.1f}%" and cells[5] == "+0.0%"


def test_the_report_reads_in_a_minute(on_off, tmp_path):  # noqa: F811
    off, on = on_off
    runs = [("chunked off", load_frames(off)), ("chunked on", load_frames(on))]
    md = write_report(runs, tmp_path / "r").read_text()
    lines = md.splitlines()
    assert lines[2].startswith("**chunked on ") and "against chunked off" in lines[2]
    assert "| metric | chunked off | chunked on | Δ |" in md
    assert "Δ: change against chunked off." in md
    assert "longer than 5 × the run's median decode step" in md
    assert "| stall threshold (ms) |" in md
    block = md[md.index("config differences"):md.index("```", md.index("config differences"))]
    assert block.splitlines()[1:] == ["  scheduler.max_num_batched_tokens: 1,024 → 128",
                                      "  scheduler.enable_chunked_prefill: off → on"]
    assert "(absent)" not in md
    assert md.index("| metric |") < md.index("config differences") < md.index("## All metrics")


def test_csv_and_chrome_traces_only_when_asked(on_off, tmp_path, capsys):  # noqa: F811
    off, on = on_off
    assert main(["analyze", str(off), str(on), "--labels", "off,on", "--out", str(tmp_path / "plain")]) == 0
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["latency_cdf.png", "report.md", "timeline.png"]
    md = (tmp_path / "plain" / "report.md").read_text()
    assert "Chrome traces" not in md and "`--chrome-trace`" in md
    assert main(["analyze", str(off), str(on), "--labels", "off,on", "--out", str(tmp_path / "all"),
                 "--csv", "--chrome-trace"]) == 0
    names = {p.name for p in (tmp_path / "all").iterdir()}
    assert {"off.trace.json", "on.trace.json", "off.gaps.csv", "on.steps.csv", "on.requests.csv"} <= names
    md = (tmp_path / "all" / "report.md").read_text()
    assert "Chrome traces (open in https://ui.perfetto.dev): `off.trace.json`, `on.trace.json`" in md
    assert "`off.gaps.csv`" in md
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["analyze", str(off), "--csv"])
    assert "--csv and --chrome-trace write into the --out folder" in capsys.readouterr().err


def test_a_simulation_outside_its_models_range_says_so_in_the_report(tmp_path, capsys):
    """The warning simulate printed, word for word, from the log and the cost model its Header names."""
    log = tmp_path / "off.jsonl"
    assert main(["simulate", str(DATA / "mooncake_head200.jsonl"), "--cost-model", "qwen3-0.6b-h200",
                 "--chunked", "off", "--out", str(log), "--no-progress"]) == 0
    (warning,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert "outside the model's profiled range" in warning
    assert main(["analyze", str(log), "--labels", "sim off", "--out", str(tmp_path / "r")]) == 0
    assert f"sim off: {warning}" in capsys.readouterr().out
    assert f"> sim off: {warning}" in (tmp_path / "r" / "report.md").read_text()
