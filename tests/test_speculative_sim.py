"""Speculative decoding in the simulator, its metrics and analysis: acceptance rates estimated from a
log, the simulated drafter and executor drawing from them (deterministic, fold == live state after
every step), the speed-up by acceptance rate, re-simulation and timing replay of a speculative log,
the CLI, the server's spec-decode counters and ``analyze``'s acceptance section."""

from __future__ import annotations

import math

import pytest

from runtime.cli import main
from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from simulator.cost.host_timing import HostTiming, fit_host_timing
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.recorded_model import RecordedCostModel
from simulator.fleet.fleet import Fleet, ReplicaSpec
from simulator.fleet.replica import SimulationError
from simulator.fleet.speculation import Speculation
from simulator.replay.replay import recorded_tokens, resimulate, timing_replay
from simulator.sim import simulate
from tests.helpers import OracleDrafter, VerifyingExecutor
from traces.acceptance import AcceptanceCounts, AcceptanceRates, estimate
from traces.events import Finished, Step, make_header
from traces.fold import FoldedState
from traces.generators import generate
from traces.log import LogWriter, read_log
from traces.speculation import rounds

TARGET = VerifyingExecutor(vocab=50, duration=0.004)
MODEL = {"const": 0.002, "prefill_tokens": 1e-5, "decode_context": 2e-8, "seqs": 3e-4}


def config(speculative="ngram:4", num_blocks=2048, budget=512):
    return EngineConfig(cache=CacheConfig(block_size=16, num_blocks=num_blocks),
                        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_model_len=2048),
                        speculative=speculative)


def workload(n=60, seed=1):
    return generate(n, rate=50.0, input_len="uniform:16:64", output_len="uniform:32:128", seed=seed)


def record(sink, rate=0.7, k=4, wl=None):
    """A "live" speculative run: the OracleDrafter's drafts (each right with ``rate``) verified by a
    greedy target, arrivals at their times; events to ``sink``, Header first."""
    cfg = config(f"ngram:{k}")
    sink(make_header(cfg, clock="wall"))
    core = EngineCore(cfg, sink=sink, drafter=OracleDrafter(TARGET, k, rate))
    specs, i, now = list(wl or workload()), 0, 0.0
    while i < len(specs) or core.has_unfinished():
        while i < len(specs) and specs[i].arrival <= now:
            core.add_request(specs[i].prompt, specs[i].params, specs[i].arrival)
            i += 1
        if not core.has_unfinished():
            now = specs[i].arrival
            continue
        now += core.step(now, TARGET).result.duration


@pytest.fixture(scope="module")
def live_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "live.jsonl"
    with LogWriter(path) as w:
        record(w)
    return path


# --- acceptance from a log --------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.3, 0.7])
def test_rates_from_a_log_of_a_known_rate(rate):
    events = []
    record(events.append, rate=rate)
    est = estimate(events)
    r = est.workload_rates()
    assert est.num_tokens == 4 and est.workload.rounds == est.workload.decodes > 500
    assert r.proposal == 1.0  # the oracle drafts every decode
    assert r.sizes == (0.0, 0.0, 0.0, 1.0)  # K drafts whenever the request had room for K
    assert len(r.alpha) == 4
    for j, a in enumerate(r.alpha):
        tried = est.workload.tried[j]
        assert abs(a - rate) < 4 * math.sqrt(rate * (1 - rate) / tried) + 0.01, (j, a, tried)
    # per request: every request its own, keyed by its arrival and prompt length
    per = est.request_rates()
    assert sum(map(len, per.values())) == 60
    # another K: positions past 4 reuse the last rate; a full proposal stays full, a shorter K cuts it
    assert r.alpha_at(7) == r.alpha[3]
    assert r.sizes_for(8) == (0.0,) * 7 + (1.0,) and r.sizes_for(2) == (0.0, 1.0)


def test_a_stop_inside_the_accepted_drafts_tries_no_further_position():
    c = AcceptanceCounts()
    c.add_round(drafts=4, tokens=3, accepted=2, full_room=True)  # 2 accepted, rejected at position 2
    c.add_round(drafts=4, tokens=2, accepted=2, full_room=True)  # a stop at the 2nd accepted draft
    assert c.tried == [2, 2, 1] and c.accepted == [2, 2]
    assert AcceptanceRates.constant(0.5).sizes_for(3) == (0.0, 0.0, 1.0)


# --- the simulated drafter and executor ----------------------------------------------------------


def _sim_bytes(path, seed, rate=0.6):
    with LogWriter(path) as w:
        simulate(workload(), config(), LinearCostModel(MODEL), sink=w,
                 speculation=Speculation.constant(rate, seed=seed))
    return path.read_bytes()


def test_simulated_speculation_is_deterministic(tmp_path):
    a = _sim_bytes(tmp_path / "a.jsonl", seed=3)
    assert a == _sim_bytes(tmp_path / "b.jsonl", seed=3)
    assert a != _sim_bytes(tmp_path / "c.jsonl", seed=4)
    est = estimate(tmp_path / "a.jsonl")
    assert est.workload.rounds > 500
    assert all(abs(x - 0.6) < 0.07 for x in est.workload_rates().alpha)  # what it drew from, read back


def test_fold_equals_the_live_state_after_every_step():
    """A small pool (preemptions, trims of rejected drafts' blocks) under per-request rates."""
    events, holder, checked = [], {}, []
    folded = FoldedState(64)

    def sink(ev):
        events.append(ev)
        folded.apply(ev)
        if type(ev) is Step:
            core = holder["core"]
            bm = core.block_manager
            bm.check_invariants()
            assert folded.block_state() == bm.snapshot()
            live = {r.request_id: r.num_computed_tokens for r in core.requests.values()}
            assert {rid: n for rid, n in folded.computed.items() if rid in live} == live
            checked.append(ev.step)

    rec = []
    record(rec.append, rate=0.6)
    sp = Speculation.from_estimate(estimate(rec), per_request=True, seed=1)
    fleet = Fleet(workload(), [ReplicaSpec(config(num_blocks=64, budget=256), LinearCostModel(MODEL), sink)],
                  speculation=sp)
    holder["core"] = fleet.replicas[0].core
    fleet.run()
    steps = [e for e in events if type(e) is Step]
    assert len(checked) == len(steps) > 100
    assert any(rounds(s) for s in steps)
    assert any(type(b).__name__ == "BlockTrimmed" for s in steps for b in s.block_events)
    assert any(type(e).__name__ == "Preempted" for e in events)
    assert fleet.rates.matched == 60 and fleet.rates.unmatched == 0


def _run(rate, spec="ngram:4", proposal=1.0):
    events = []
    sp = None if rate is None else Speculation.constant(rate, proposal=proposal)
    result = simulate(workload(), config(spec), LinearCostModel(MODEL), sink=events.append, speculation=sp)
    outputs = {e.request_id: e.num_output_tokens for e in events if type(e) is Finished}
    return result, events, outputs


def test_the_speed_up_grows_with_the_acceptance_rate():
    plain, _, plain_out = _run(None, "")
    ends = {}
    for rate in (0.0, 0.5, 0.8, 1.0):
        result, _, out = _run(rate)
        assert out == plain_out
        ends[rate] = result.end_time
    assert ends[0.0] > plain.end_time  # drafts that are never accepted only cost
    assert ends[0.0] > ends[0.5] > ends[0.8] > ends[1.0]
    assert ends[1.0] < plain.end_time
    assert _run(0.8, "ngram:8")[0].end_time < ends[0.8]  # more drafts at a high rate: faster still


def test_rate_zero_costs_the_extra_tokens_only():
    plain, plain_events, plain_out = _run(None, "")
    _, events, out = _run(0.0)
    steps = [e for e in events if type(e) is Step]
    assert out == plain_out
    assert all(a == 0 for s in steps for _, _, a in rounds(s))
    assert all(len(t) == 1 for s in steps for t in s.tokens)  # one token a decode, as without drafts
    drafts = sum(d for s in steps for _, d, _ in rounds(s))
    tokens = sum(sp.num_tokens for s in steps for sp in s.spans)
    plain_tokens = sum(sp.num_tokens for e in plain_events if type(e) is Step for sp in e.spans)
    assert tokens == plain_tokens + drafts
    # never proposing: the plain run's steps exactly (the Header says what differs)
    _, none, _ = _run(0.5, proposal=0.0)
    assert [e for e in none[1:] if type(e) is Step] == [e for e in plain_events[1:] if type(e) is Step]


def test_rounds_drawn_no_drafts_overlap_as_a_throttled_live_drafter_s_do():
    """Under async scheduling a simulated step of a draft model's config whose requests draw no
    drafts next is planned before its tokens land, as without speculation: never proposing gives
    the plain run's steps, times included. An ngram config's steps never overlap, as live."""
    model = LinearCostModel(MODEL).with_host(HostTiming(overlap=True))
    assert model.timing(512).plans_ahead

    def steps(spec, speculation):
        events = []
        simulate(workload(), config(spec), model, sink=events.append, speculation=speculation)
        return [e for e in events if type(e) is Step]

    never = Speculation.constant(0.5, proposal=0.0)
    assert steps("model:draft:4", never) == steps("", None)
    assert steps("ngram:4", never) != steps("", None)  # an ngram drafter reads every token: no overlap


def test_a_speculative_config_without_rates_is_refused():
    with pytest.raises(SimulationError, match="acceptance"):
        simulate(workload(5), config(), LinearCostModel(MODEL))


# --- a speculative log: re-simulation, timing replay ---------------------------------------------


def test_resimulating_a_speculative_log_takes_its_own_rates(live_log, tmp_path):
    events = []
    resimulate(live_log, LinearCostModel(MODEL), sink=events.append)
    header = events[0]
    assert header.extra["speculation"]["per"] == "request"
    assert header.extra["speculation"]["source"] == str(live_log)
    a, b = estimate(live_log).workload_rates(), estimate(events).workload_rates()
    assert all(abs(x - y) < 0.08 for x, y in zip(a.alpha, b.alpha))
    assert {e.request_id: e.num_output_tokens for e in events if type(e) is Finished} == {
        e.request_id: e.num_output_tokens for e in read_log(live_log) if type(e) is Finished}


def test_timing_replay_of_a_speculative_log(live_log):
    report = timing_replay(live_log, RecordedCostModel.from_log(live_log))
    s = report.summary
    assert s["step_mape"] == 0 and s["ttft"]["max_abs_s"] == 0 and s["e2e"]["max_abs_s"] == 0
    assert s["by_kind"]["verify"]["steps"] > 0
    token = recorded_tokens(live_log)
    for ev in read_log(live_log):
        if type(ev) is Step and ev.drafts:
            k = 0
            for span in ev.spans:
                if span.sample:
                    drafts = ev.drafts[k]
                    first = span.start + span.num_tokens - len(drafts)
                    assert [token(span.request_id, first + i) for i in range(len(ev.tokens[k]))] == ev.tokens[k]
                    k += 1


# --- the CLI -------------------------------------------------------------------------------------


def test_simulate_cli(live_log, tmp_path, capsys):
    out = tmp_path / "sim.jsonl"
    assert main(["simulate", str(live_log), "--cost-model", "qwen3-0.6b-h200", "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "speculative decoding, K=4: drafts and acceptance from" in text and "(per request)" in text
    assert main(["simulate", str(live_log), "--cost-model", "qwen3-0.6b-h200", "--out", str(out),
                 "--no-progress", "--speculative", "ngram:8"]) == 0
    text = capsys.readouterr().out
    assert "recorded at K=4" in text and "reuse the last measured rate" in text
    assert estimate(out).num_tokens == 8
    wl = tmp_path / "wl.jsonl"
    workload(20).save(wl)
    with pytest.raises(SystemExit):  # a workload carries no rates
        main(["simulate", str(wl), "--cost-model", "qwen3-0.6b-h200", "--out", str(out), "--no-progress",
              "--speculative", "ngram:4"])
    assert "give --acceptance LOG" in capsys.readouterr().err
    for acceptance in ("0.7", str(live_log)):
        assert main(["simulate", str(wl), "--cost-model", "qwen3-0.6b-h200", "--out", str(out), "--no-progress",
                     "--speculative", "ngram:4", "--acceptance", acceptance]) == 0
        assert "speculative decoding, K=4" in capsys.readouterr().out


def test_fidelity_what_if_speculation(live_log, tmp_path, capsys):
    plain = tmp_path / "plain.jsonl"
    with LogWriter(plain) as w:
        simulate(workload(), config(""), LinearCostModel(MODEL), sink=w)
    args = ["fidelity", str(plain), "--cost-model", "qwen3-0.6b-h200", "--no-replay",
            "--plot", str(tmp_path / "f.png"), "--what-if", "speculative=ngram:4"]
    with pytest.raises(SystemExit):  # a plain log has no rates of its own
        main(args)
    assert "--acceptance" in capsys.readouterr().err
    assert main([*args, "--acceptance", "0.8"]) == 0
    assert "speculative off → ngram:4" in capsys.readouterr().out


# --- metrics and analysis ------------------------------------------------------------------------


def test_server_spec_decode_counters_agree_with_the_log(smollm2_tokenizer):
    from prometheus_client import CollectorRegistry, generate_latest

    from runtime.serving.engine_protocol import EngineState
    from runtime.serving.llm_engine import LLMEngine
    from runtime.serving.server.metrics import _EngineCollector

    events = []
    cfg = config()
    core = EngineCore(cfg, sink=events.append, drafter=OracleDrafter(TARGET, 4, 0.6))
    engine = LLMEngine.from_core(core, TARGET, smollm2_tokenizer)
    for i in range(6):
        engine.add_request([1 + i, 2, 3, 4, 5] * 4, max_tokens=30, ignore_eos=True)
    while engine.has_unfinished():
        engine.step()
    drafts = tokens = accepted = 0
    per = [0] * 4
    for ev in events:
        if type(ev) is Step:
            for _, d, a in rounds(ev):
                drafts, tokens, accepted = drafts + 1, tokens + d, accepted + a
                for j in range(a):
                    per[j] += 1
    s = engine.stats
    assert (s.spec_drafts, s.spec_draft_tokens, s.spec_accepted_tokens) == (drafts, tokens, accepted) and drafts

    class Front:  # what the collector reads of an AsyncLLMEngine
        config = cfg
        state = EngineState(stats=s)

    class VllmNames:  # the collector's vllm:* families (the minivllm_* ones read the front end's own state)
        def collect(self):
            return _EngineCollector(Front(), "m")._vllm()

    registry = CollectorRegistry()
    registry.register(VllmNames())
    text = generate_latest(registry).decode()
    assert f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {float(drafts)}' in text
    assert f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {float(tokens)}' in text
    assert f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {float(accepted)}' in text
    for j, n in enumerate(per):
        assert (f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{j}"}} '
                f'{float(n)}') in text


def test_analyze_prints_the_acceptance_section(live_log, capsys):
    assert main(["analyze", str(live_log)]) == 0
    text = capsys.readouterr().out
    est = estimate(live_log).workload
    assert f"speculative decoding (K=4), live.jsonl: {est.rounds:,} rounds of {est.decodes:,} decodes" in text
    assert "acceptance rate" in text and "tokens per round" in text and "1: α " in text


def test_host_gaps_after_verify_steps_are_fitted_by_their_drafts(tmp_path):
    """An engine spending 0.1 ms + 20 µs a span + 5 µs a verified draft between steps: a fit of its
    log finds each part, so a plain run's gaps are not priced at a speculating one's."""
    model = LinearCostModel(MODEL)
    model = model.with_host(HostTiming(gap_const=1e-4, gap_per_seq=2e-5, gap_per_draft=5e-6))
    path = tmp_path / "spec.jsonl"
    with LogWriter(path) as w:
        simulate(workload(), config(), model, sink=w, speculation=Speculation.constant(0.6, seed=1))
    fitted = fit_host_timing([path])
    assert (fitted.gap_const, fitted.gap_per_seq, fitted.gap_per_draft) == pytest.approx((1e-4, 2e-5, 5e-6), rel=1e-3)
    plain = tmp_path / "plain.jsonl"
    with LogWriter(plain) as w:
        simulate(workload(), config(""), model, sink=w)
    assert fit_host_timing([plain]).gap_per_draft == 0.0
