"""A what-if's conclusion (two runs simulated from one model) counts a change only beyond the
model's error against the live run and a floor; numbers that move a little between two runs of the
same demo keep its wording; the model's error has a line of its own; ``analyze --what-if`` leads
the report with both."""

from __future__ import annotations

import re

import pytest

from analysis.what_if import FLOOR_PCT, error_line, headline, weigh
from runtime.cli import main
from tests.test_analysis_stalls import on_off  # noqa: F401  (fixture)


def _summary(ttft=(1.0, 1.0), tpot=(1.0, 1.0), e2e=(1.0, 1.0), tput=100.0) -> dict:
    pct = lambda v: {"p50": v[0], "p90": v[1]}  # noqa: E731
    return {"ttft_s": pct(ttft), "tpot_s": pct(tpot), "e2e_s": pct(e2e), "output_throughput_tok_s": tput}


def _verdict(base, change, live) -> dict[str, bool]:
    return {w["family"]: w["beyond"] for w in weigh(base, change, live)}


def test_a_change_counts_only_beyond_the_models_error_on_it():
    on = _summary(ttft=(1.0, 2.0), tpot=(0.10, 0.12), e2e=(5.0, 8.0))
    off = _summary(ttft=(0.6, 1.8), tpot=(0.091, 0.125), e2e=(4.5, 7.6))  # TTFT −40%, TPOT −9%, E2E −10%
    live = _summary(ttft=(1.25, 2.1), tpot=(0.104, 0.14), e2e=(5.7, 8.5))  # the model: TTFT −20%, TPOT −14%...
    assert _verdict(on, off, live) == {"TTFT": True, "TPOT": False, "E2E": False}
    line = headline("sim off", "sim on", weigh(on, off, live))
    assert line.startswith("sim off against sim on (both simulated from one model): lowers TTFT p50 by 40%, "
                           "beyond the model's error on it (20%); TPOT (−9.0%, its error 14%)")
    assert line.endswith("within the model's error")


def test_a_change_under_the_floor_is_noise_even_where_the_model_is_exact():
    on = _summary(ttft=(1.0, 1.0))
    off = _summary(ttft=(1.0 - (FLOOR_PCT - 1) / 100, 1.0))
    assert _verdict(on, off, on) == {"TTFT": False, "TPOT": False, "E2E": False}
    assert "no latency moves beyond the model's error" in headline("b", "a", weigh(on, off, on))


def _words(line: str) -> str:
    return re.sub(r"[−+]?\d[\d.,]*%", "N%", line)


def test_two_runs_whose_numbers_differ_a_little_say_the_same():
    """Every number of a second run a few percent off: the same words, only the numbers differ."""
    on = _summary(ttft=(1.0, 2.0), tpot=(0.10, 0.12), e2e=(5.0, 8.0))
    lines = set()
    for jitter in (0.97, 1.0, 1.03):
        off = _summary(ttft=(0.55 * jitter, 1.7), tpot=(0.099, 0.121 * jitter), e2e=(4.9, 7.9 * jitter))
        live = _summary(ttft=(1.2 / jitter, 2.2), tpot=(0.11, 0.13), e2e=(5.5 * jitter, 8.5))
        lines.add(_words(headline("off", "on", weigh(on, off, live))))
    assert lines == {"off against on (both simulated from one model): lowers TTFT p50 by N%, beyond the model's "
                     "error on it (N%); TPOT (N%, its error N%), E2E (N%, its error N%) within the model's error"}


def test_the_models_error_is_its_own_line_simulation_minus_live():
    line = error_line("live", _summary(ttft=(0.8, 1.0), tput=102.0), _summary())
    assert line == ("the model's error against live, simulation minus live: TTFT p50 −20%, p90 +0.0%; "
                    "TPOT p50 +0.0%, p90 +0.0%; E2E p50 +0.0%, p90 +0.0%; output throughput +2.0%")


def test_analyze_what_if_leads_the_report_with_the_verdict_and_the_error(on_off, tmp_path, capsys):  # noqa: F811
    off, on = on_off
    assert main(["analyze", str(on), str(off), str(on), "--what-if", "--labels", "on,off,live",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "conclusion: off against on (both simulated from one model): " in out
    assert "model error: the model's error against live, simulation minus live: TTFT p50 +0.0%" in out
    md = (tmp_path / "report.md").read_text().splitlines()
    assert md[2].startswith("**off against on (both simulated from one model): ")
    assert md[4].startswith("the model's error against live")


def test_analyze_what_if_takes_three_logs(on_off, capsys):  # noqa: F811
    off, on = on_off
    with pytest.raises(SystemExit):
        main(["analyze", str(on), str(off), "--what-if"])
    assert "--what-if: give three logs (BASE CHANGE LIVE), not 2" in capsys.readouterr().err
