"""Trace-vs-live regression suite: golden live logs of the real engine (SmolLM2-135M, CPU, float32)
on four scheduler scenarios × chunked prefill on/off (tests/data/golden/, recorded by
scripts/record_golden.py).

- execute-replay: the recorded plans on today's model runner sample every recorded token;
- re-simulation with the recorded durations (and tokens) makes the recorded decisions, and
  timing-replay with them reproduces every TTFT and E2E;
- ``minivllm regress`` of a golden log against itself passes, against a perturbed copy fails.

The logs are about decisions and tokens (deterministic); their timings are one run on a noisy
shared CPU, so nothing here compares them with a fresh live run's.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import msgspec
import pytest

from analysis.regress import regress
from traces.events import Arrived, Header, Step
from traces.log import LogWriter, read_log
from traces.prompt import PromptIds

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
SCENARIOS = ("long_during_decode", "mixed", "burst", "shared_prefix")
LOGS = [f"{s}_chunked_{mode}.jsonl.gz" for s in SCENARIOS for mode in ("on", "off")]


def golden(name: str) -> Path:
    return GOLDEN / name


def test_the_golden_logs_are_all_there_small_and_what_their_names_say():
    assert sorted(p.name for p in GOLDEN.glob("*.jsonl.gz")) == sorted(LOGS)
    assert sum(golden(n).stat().st_size for n in LOGS) < 400_000
    for name in LOGS:
        events = list(read_log(golden(name)))
        header = events[0]
        assert isinstance(header, Header) and header.clock == "wall" and "SmolLM2" in header.model_identity
        assert header.extra["device"] == "cpu" and header.extra["dtype"] == "float32"
        assert header.config["scheduler"]["enable_chunked_prefill"] == name.endswith("on.jsonl.gz")
        arrived = [e for e in events if isinstance(e, Arrived)]
        assert 12 <= len(arrived) <= 40 and all(isinstance(a.prompt, PromptIds) for a in arrived)  # replayable
        assert all(a.params.temperature == 0 and a.params.ignore_eos for a in arrived)


def test_chunking_is_what_tells_the_long_prompt_scenarios_apart():
    """Chunked off prefills a 320-token prompt in one step beside the decodes; on never runs a
    step over its 128-token budget."""
    for mode, budget in (("on", 128), ("off", 384)):
        steps = [e for e in read_log(golden(f"long_during_decode_chunked_{mode}.jsonl.gz")) if isinstance(e, Step)]
        assert max(sum(s.num_tokens for s in st.spans) for st in steps) <= budget
        whole = [st for st in steps if any(s.num_tokens == 320 for s in st.spans)]
        assert bool(whole) == (mode == "off")
        if mode == "off":
            assert any(s.num_tokens == 1 for s in whole[0].spans), "the long prompt lands during decodes"


@cache
def _cached_load(model, device, dtype, seed):
    from runtime.executor.model import loader

    return loader.load_model(model, device=device, dtype=dtype, seed=seed)


@pytest.fixture(scope="module")
def replay_factory():
    """``replay_executor_factory`` on the installed default model, loaded once for the module
    (a load takes seconds; each log still gets a runner and KV pool of its own)."""
    pytest.importorskip("torch")
    from runtime.executor import setup
    from runtime.executor.model.loader import default_model_path

    mp = pytest.MonkeyPatch()
    mp.setattr(setup, "load_model", lambda model, *, device, dtype, seed: _cached_load(model, device, dtype, seed))
    # the model this machine has installed: the Header's path is the recording machine's
    yield setup.replay_executor_factory(model=str(default_model_path()), device="cpu")
    mp.undo()


@pytest.mark.slow  # ~30 s for the 8 logs on an idle 2-core CPU (the recorded steps, on the model)
@pytest.mark.parametrize("name", LOGS)
def test_execute_replay_samples_every_recorded_token(name, replay_factory):
    from simulator.replay.execute import execute_replay

    events = list(read_log(golden(name)))
    report = execute_replay(events, replay_factory)
    assert report.ok, report.first and report.first.context
    assert report.steps == sum(isinstance(e, Step) for e in events)
    assert report.compared_tokens == sum(len(t) for e in events if isinstance(e, Step) for t in e.tokens)


@pytest.mark.parametrize("name", LOGS)
def test_resimulation_with_the_recorded_durations_makes_the_recorded_decisions(name, tmp_path):
    from simulator.cost.recorded_model import RecordedCostModel
    from simulator.replay.replay import recorded_tokens, resimulate

    path = golden(name)
    resim = tmp_path / "resim.jsonl"
    with LogWriter(resim) as log:
        resimulate(path, RecordedCostModel.from_log(path), sink=log, token_fn=recorded_tokens(path))
    # decisions, tokens and every latency percentile (to float rounding) are the recording's
    report = regress(path, resim, default_tolerance=1e-6, two_sided=True)
    assert report.passed, report.failures
    assert report.steps[0] == report.steps[1] > 0 and report.differing_steps == 0
    differ = [k for k, _ in report.config_differences]
    assert "clock" in differ and not [k for k in differ if k.split(".")[0] in ("scheduler", "cache", "seed")]


@pytest.mark.parametrize("name", LOGS)
def test_timing_replay_with_the_recorded_durations_is_exact(name):
    from simulator.cost.recorded_model import RecordedCostModel
    from simulator.replay.replay import timing_replay

    path = golden(name)
    s = timing_replay(path, RecordedCostModel.from_log(path)).summary
    assert s["ttft"]["n"] > 0 and s["ttft"]["max_abs_s"] < 1e-9 and s["e2e"]["max_abs_s"] < 1e-9
    assert s["makespan_predicted_s"] == pytest.approx(s["makespan_recorded_s"], abs=1e-9)


@pytest.mark.parametrize("name", [LOGS[0], LOGS[-1]])
def test_regress_of_a_golden_log_against_itself_passes(name, tmp_path, capsys):
    from runtime.cli import main

    js = tmp_path / "r.json"
    assert main(["regress", str(golden(name)), str(golden(name)), "--two-sided", "--default-tolerance", "0",
                 "--json", str(js)]) == 0
    assert json.loads(js.read_text())["passed"] is True
    assert capsys.readouterr().out.rstrip().endswith("RESULT: PASS")


def _perturbed(src: Path, dst: Path, change) -> Path:
    with LogWriter(dst) as out:
        for ev in read_log(src):
            out(change(ev))
    return dst


def test_regress_of_a_golden_log_against_a_perturbed_copy_fails(tmp_path, capsys):
    """Two spans of a mixed step swapped (a different batch order: same work, other decisions),
    and, separately, one step twice as long (same decisions, other latencies)."""
    from runtime.cli import main

    src = golden("mixed_chunked_on.jsonl.gz")
    target = next(e.step for e in read_log(src) if isinstance(e, Step) and len(e.spans) >= 2)

    def swap(ev):
        if isinstance(ev, Step) and ev.step == target:
            return msgspec.structs.replace(ev, spans=[ev.spans[1], ev.spans[0], *ev.spans[2:]])
        return ev

    swapped = _perturbed(src, tmp_path / "swapped.jsonl", swap)
    js = tmp_path / "r.json"
    assert main(["regress", str(src), str(swapped), "--json", str(js)]) == 1
    out = capsys.readouterr().out
    assert f"first divergent step {target}: spans" in out and "RESULT: FAIL (decisions" in out
    report = json.loads(js.read_text())
    assert report["first_divergence"]["step"] == target and "decisions" in report["failures"]

    last = max(e.step for e in read_log(src) if isinstance(e, Step))
    stretch = {"by": 0.0}

    def slower(ev):  # the last step takes twice as long; its finishes move with it
        if isinstance(ev, Step) and ev.step == last:
            stretch["by"] = ev.end - ev.start
            return msgspec.structs.replace(ev, end=ev.end + stretch["by"])
        if stretch["by"] and hasattr(ev, "time"):
            return msgspec.structs.replace(ev, time=ev.time + stretch["by"])
        return ev

    slow = _perturbed(src, tmp_path / "slow.jsonl", slower)
    assert main(["regress", str(src), str(slow), "--tolerance", "makespan=0.01"]) == 1
    out = capsys.readouterr().out
    assert "decisions: ok" in out and "makespan" in out.splitlines()[-1]
    assert main(["regress", str(src), str(slow), "--ignore", "latency"]) == 0
