"""``minivllm regress``: a log against itself passes; a changed decision, token or latency fails
with the first divergent step named, exit status 1 and a JSON report; tolerances and --ignore."""

from __future__ import annotations

import json

import msgspec
import pytest

from analysis.regress import regress, render_report
from analysis.tolerances import ToleranceError, parse_tolerances, tolerance_for
from runtime.cli import main
from simulator.cost.cost_model import CostModel
from simulator.sim import simulate
from tests.sim_helpers import mixed_workload, small_config
from traces.events import Admitted, Finished, Preempted, Step
from traces.log import LogWriter, read_log


class ShapeCost(CostModel):
    def step_time(self, step, spans, verifying=()):
        return 0.005 + 2e-4 * sum(s.num_tokens for s in spans) + 1e-3 * len(spans)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """A simulated log with chunked prefill, prefix hits and preemptions (a small KV pool)."""
    path = tmp_path_factory.mktemp("regress") / "base.jsonl"
    with LogWriter(path) as log:
        simulate(mixed_workload(40), small_config(num_blocks=40, budget=128), ShapeCost(), sink=log)
    events = list(read_log(path))
    assert any(isinstance(e, Preempted) for e in events)
    return path


def rewrite(src, dst, change):
    """Copy a log, passing each event through ``change`` (None drops it)."""
    with LogWriter(dst) as out:
        for ev in read_log(src):
            ev = change(ev)
            if ev is not None:
                out(ev)
    return dst


def test_a_log_against_itself_passes(baseline, tmp_path, capsys):
    js = tmp_path / "r.json"
    assert main(["regress", str(baseline), str(baseline), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "decisions: ok" in out and "tokens: ok" in out and out.rstrip().endswith("RESULT: PASS")
    report = json.loads(js.read_text())
    assert report["passed"] is True and report["failures"] == [] and report["differing_steps"] == 0
    assert report["counts"]["preemptions"]["baseline"] == report["counts"]["preemptions"]["new"] > 0


def test_a_changed_span_is_the_first_divergent_step(baseline, tmp_path, capsys):
    def change(ev):
        if isinstance(ev, Step) and ev.step == 7:
            span = ev.spans[0]
            return msgspec.structs.replace(ev, spans=[msgspec.structs.replace(span, num_tokens=span.num_tokens + 1),
                                                      *ev.spans[1:]])
        return ev

    new = rewrite(baseline, tmp_path / "new.jsonl", change)
    r = regress(baseline, new)
    assert not r.passed and r.failures == ["decisions"]
    assert r.differing_steps == 1 and r.first_divergence.step == 7 and r.first_divergence.fields == ["spans"]
    assert r.counts["scheduled_tokens"][1] == r.counts["scheduled_tokens"][0] + 1
    assert main(["regress", str(baseline), str(new), "--json", "-"]) == 1
    report = json.loads(capsys.readouterr().out)  # --json -: the JSON alone
    assert report["first_divergence"]["step"] == 7 and report["failures"] == ["decisions"]


def test_a_dropped_block_event_and_a_lost_admission_are_decisions(baseline, tmp_path):
    dropped = {"block": False, "admitted": False}

    def change(ev):
        if isinstance(ev, Step) and ev.block_events and not dropped["block"] and ev.step > 3:
            dropped["block"] = True
            return msgspec.structs.replace(ev, block_events=ev.block_events[1:])
        if isinstance(ev, Admitted) and ev.step > 20 and not dropped["admitted"]:
            dropped["admitted"] = True
            return None
        return ev

    r = regress(baseline, rewrite(baseline, tmp_path / "new.jsonl", change))
    assert r.failures == ["decisions"] and r.differing_steps == 2
    assert r.first_divergence.fields == ["block_events"]
    assert r.counts["admissions"][0] == r.counts["admissions"][1] + 1
    text = render_report(r)
    assert f"first divergent step {r.first_divergence.step}: block_events" in text
    assert "counts that differ: admissions" in text


def test_a_log_cut_short_is_missing_steps(baseline, tmp_path):
    last = max(e.step for e in read_log(baseline) if isinstance(e, Step))
    cut = {"from": False}

    def change(ev):  # everything from step last - 2's first event on is gone (a killed run)
        cut["from"] = cut["from"] or (isinstance(ev, Step | Admitted | Preempted) and ev.step > last - 3)
        return None if cut["from"] else ev

    new = rewrite(baseline, tmp_path / "new.jsonl", change)
    r = regress(baseline, new, ignore=("latency",))
    assert r.steps == (last + 1, last - 2) and r.differing_steps == 3
    assert r.first_divergence.step == last - 2 and r.first_divergence.fields == ["missing in new"]


def test_other_tokens_fail_the_token_check_only(baseline, tmp_path):
    def change(ev):
        if isinstance(ev, Step) and ev.step == 5 and ev.tokens:
            return msgspec.structs.replace(ev, tokens=[[t + 1 for t in ev.tokens[0]], *ev.tokens[1:]])
        return ev

    new = rewrite(baseline, tmp_path / "new.jsonl", change)
    r = regress(baseline, new)
    assert r.failures == ["tokens"] and r.first_token_divergence["step"] == 5
    assert regress(baseline, new, ignore=("tokens",)).passed


def _slower(baseline, dst, factor, after=10):
    """Every step from ``after`` on takes ``factor`` times as long (later events shift with them)."""
    shift = {"by": 0.0}

    def change(ev):
        if isinstance(ev, Step):
            start = ev.start + shift["by"]
            d = (ev.end - ev.start) * (factor if ev.step >= after else 1.0)
            shift["by"] += d - (ev.end - ev.start)
            return msgspec.structs.replace(ev, start=start, end=start + d)
        if isinstance(ev, Finished | Admitted | Preempted):
            return msgspec.structs.replace(ev, time=ev.time + shift["by"])
        return ev

    return rewrite(baseline, dst, change)


def test_slower_steps_fail_the_latency_check_within_its_tolerances(baseline, tmp_path, capsys):
    new = _slower(baseline, tmp_path / "slow.jsonl", 1.5)
    r = regress(baseline, new)
    assert r.decisions_ok and r.tokens_ok and not r.passed
    failed = {c.metric for c in r.latency if not c.passed}
    assert {"e2e_p50", "makespan", "itl_p50"} <= failed
    assert main(["regress", str(baseline), str(new), "--tolerance", "*=1.0"]) == 0
    assert main(["regress", str(baseline), str(new), "--ignore", "latency"]) == 0
    assert main(["regress", str(baseline), str(new), "--tolerance", "*=1.0,e2e_p50=0.01"]) == 1
    out = capsys.readouterr().out
    assert "RESULT: FAIL (latency e2e_p50)" in out


def test_faster_fails_only_two_sided_and_small_changes_under_min_delta_pass(baseline, tmp_path):
    fast = _slower(baseline, tmp_path / "fast.jsonl", 0.5)
    assert regress(baseline, fast).passed
    assert not regress(baseline, fast, two_sided=True).passed
    assert regress(baseline, fast, two_sided=True, min_delta_s=100.0).passed


def test_tolerance_specs():
    assert parse_tolerances("ttft_p50=0.1, e2e_*=0.5,*=0.2") == {"ttft_p50": 0.1, "e2e_*": 0.5, "*": 0.2}
    tol = parse_tolerances("e2e_*=0.5,*=0.2,ttft_p50=0.1")
    assert (tolerance_for("ttft_p50", tol), tolerance_for("e2e_p99", tol), tolerance_for("itl_p50", tol)) == (
        0.1, 0.2, 0.2)  # an exact name wins; else the last matching pattern
    assert tolerance_for("itl_p50", {}) == 0.1
    for bad, why in (("ttft", "expected METRIC=FRACTION"), ("ttft_p42=1", "matches no metric"),
                     ("ttft_p50=x", "is not a number"), ("ttft_p50=-1", ">= 0"), ("ttft_p50=nan", ">= 0")):
        with pytest.raises(ToleranceError, match=why):
            parse_tolerances(bad)


def test_usage_errors_exit_2(baseline, tmp_path, capsys):
    for argv, why in ((["--tolerance", "foo=1"], "--tolerance: 'foo' matches no metric"),
                      (["--ignore", "speed"], "--ignore: unknown check 'speed'")):
        with pytest.raises(SystemExit) as e:
            main(["regress", str(baseline), str(baseline), *argv])
        assert e.value.code == 2 and why in capsys.readouterr().err
    not_a_log = tmp_path / "x.jsonl"
    not_a_log.write_text('{"type": "Arrived"}\n')
    with pytest.raises(SystemExit) as e:
        main(["regress", str(baseline), str(not_a_log)])
    assert e.value.code == 2 and "x.jsonl" in capsys.readouterr().err
