"""Prefill steps padded to the piecewise graphs' captured counts: the rule, where a log says it,
the ``padded_tokens`` feature, and a model that pads a simulation to that simulation's budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.cost.cost_model import CostModelError
from simulator.cost.features import EXT_FEATURES, FEATURES, ext_features, step_features
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.loading import load_cost_model
from simulator.cost.model_base import for_step_budget
from simulator.cost.step_data import StepData
from simulator.fitting.fit import fit_candidate
from simulator.fleet.fleet import Fleet, ReplicaSpec
from simulator.sim import simulate
from tests.sim_helpers import mixed_workload, small_config
from traces.events import Header, Span, make_header
from traces.log import LogWriter
from traces.step_padding import StepPadding, token_buckets

PAD = FEATURES.index("padded_tokens")
TRUE = {"const": 0.004, "prefill_tokens": 3e-5, "prefill_attention": 2e-9, "decode_seqs": 2e-4,
        "decode_context": 4e-7, "seqs": 1e-4, "prefill_step": 0.012, "longest_program": 3e-7,
        "padded_tokens": 1.5e-5}
GPU = {"device": "cuda:0", "attention_backend": "triton"}


def test_token_buckets():
    assert token_buckets(2048) == [16, 32, 64, 128, 256, 512, 1024, 1536, 2048]
    assert token_buckets(24) == [16, 24]
    assert token_buckets(10000)[-4:] == [4096, 6144, 8192, 10000]
    b = token_buckets(16384)  # (the runtime captures a graph per count: runtime/executor/piecewise_graphs.py)
    assert b[-1] == 16384 and b == sorted(set(b)) and 6144 in b and 4096 in b


@pytest.mark.parametrize(("tokens", "padding"), [(1, 15), (16, 0), (17, 15), (1100, 436), (1536, 0), (2047, 1),
                                                 (2048, 0), (2049, 0), (9000, 0)])
def test_a_step_pads_to_the_next_captured_count_and_not_past_the_largest(tokens, padding):
    assert StepPadding(2048).padding(tokens) == padding


def test_padding_needs_a_positive_budget():
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        StepPadding(0)


@pytest.mark.parametrize(("config", "extra", "expected"), [
    ({"scheduler": {"max_num_batched_tokens": 2048}}, {**GPU, "piecewise_tokens": 1024}, 1024),  # said
    ({"scheduler": {"max_num_batched_tokens": 2048}}, {**GPU, "piecewise_tokens": 0}, None),  # eager
    ({"scheduler": {"max_num_batched_tokens": 2048}}, GPU, 2048),  # a log from before headers said it
    ({"scheduler": {"max_num_batched_tokens": 2048}}, {"device": "cuda", "attention_backend": "torch"}, None),
    ({"scheduler": {"max_num_batched_tokens": 2048}}, {"device": "cpu", "attention_backend": "triton"}, None),
    ({}, None, None),
    ({"scheduler": {"max_num_batched_tokens": 2048}}, {"device": None, "attention_backend": "triton"}, None),
])
def test_a_logs_header_says_how_its_prefill_steps_were_padded(config, extra, expected):
    padding = StepPadding.from_header(config, extra)
    assert (padding.max_tokens if padding else None) == expected


def test_the_feature_counts_padding_of_prefill_steps_only():
    decode = [Span(0, 100, 1, True), Span(1, 7, 1, True)]
    mixed = [*decode, Span(2, 16, 1000, False)]  # 1,002 tokens run as 1,024
    padding = StepPadding(2048)
    assert step_features(decode, None, padding)[PAD] == 0
    assert step_features(mixed, None, padding)[PAD] == 22
    assert step_features(mixed)[PAD] == 0  # not padded
    assert step_features([Span(0, 0, 3000, False)], None, padding)[PAD] == 0  # beyond the graphs: eager
    assert dict(zip(EXT_FEATURES, ext_features(mixed, None, padding)))["tokens"] == 1002


def test_both_model_kinds_add_the_padded_tokens():
    mixed = [Span(0, 100, 1, True), Span(2, 16, 1000, False)]
    linear = LinearCostModel(TRUE)
    assert linear.padding is None
    unpadded = linear.step_time(0, mixed)
    linear = linear.with_step_padding(StepPadding(2048))
    assert linear.step_time(0, mixed) == pytest.approx(unpadded + 23 * TRUE["padded_tokens"])
    expected = float(np.dot([TRUE[k] for k in FEATURES], step_features(mixed, None, StepPadding(2048))))
    assert linear.step_time(0, mixed) == pytest.approx(expected)


def _log(path, truth, extra, **cfg):
    """A log timed by ``truth`` whose header says ``extra`` (a GPU that padded its steps, or not)."""
    config = small_config(**cfg)
    with LogWriter(path) as w:
        simulate(mixed_workload(150, seed=len(str(path)), rate=60), config, truth, sink=lambda ev: w(
            make_header(config, clock="wall", extra=extra) if isinstance(ev, Header) else ev))
    return str(path)


def test_a_fit_on_padded_logs_finds_the_padding_cost_and_keeps_it(tmp_path):
    truth = LinearCostModel(TRUE)
    truth = truth.with_step_padding(StepPadding(256))
    logs = [_log(tmp_path / "a.jsonl", truth, GPU), _log(tmp_path / "b.jsonl", truth, GPU, budget=512)]
    data = StepData.from_logs(logs)
    assert data.step_padding == StepPadding(256)
    assert data.features[:, PAD].max() > 0
    model = fit_candidate("linear-absolute", data)
    assert model.coefficients["padded_tokens"] == pytest.approx(TRUE["padded_tokens"], rel=0.05)
    assert model.step_padding == StepPadding(256)
    model.save(tmp_path / "m.json")
    again = load_cost_model(tmp_path / "m.json")
    assert again.step_padding == again.padding == StepPadding(256)
    trees = fit_candidate("linear+gbm", data)
    assert trees.step_padding == StepPadding(256)
    np.testing.assert_allclose([trees.step_time(0, s) for s in _steps(logs[0])], data.durations[data.log_index == 0],
                               rtol=0.05)


def _steps(path):
    from traces.events import Step
    from traces.log import read_log

    return [ev.spans for ev in read_log(path) if isinstance(ev, Step)]


def test_a_log_that_did_not_pad_fits_no_padding(tmp_path):
    data = StepData.from_logs([_log(tmp_path / "cpu.jsonl", LinearCostModel(TRUE), {"device": "cpu"})])
    assert data.step_padding is None and not data.features[:, PAD].any()
    assert fit_candidate("linear-absolute", data).step_padding is None


def test_a_simulation_pads_to_its_own_budget(tmp_path):
    """A model fitted on steps padded up to 256 tokens, simulating a 512-token budget, pads as an
    engine of that budget does: its steps of 257-512 tokens pay for the padding to 512."""
    model = _padded()
    view = for_step_budget(model, 512)  # what a replica of that budget prices with
    assert view.padding == StepPadding(512) and view.step_padding == StepPadding(256)
    assert model.padding == StepPadding(256)  # the model itself is left as it was
    step = [Span(0, 0, 300, False)]
    assert view.step_time(0, step) == pytest.approx(LinearCostModel(TRUE).step_time(0, step)
                                                    + 212 * TRUE["padded_tokens"])
    assert for_step_budget(model, 256) is model
    unpadded = LinearCostModel(TRUE)
    assert for_step_budget(unpadded, 512) is unpadded


def test_one_model_prices_two_budgets_at_once(tmp_path):
    """Two simulations made from one model before either runs (as a what-if A/B may): each pads to
    its own budget, and their logs equal those of simulations made and run one at a time. (The
    1,024-token one first: priced with the 256-token budget's counts, its longer steps would not pad.)"""
    model = _padded()
    workload = mixed_workload(60, seed=3)
    budgets = (1024, 256)
    logs = {b: (tmp_path / f"{b}_together.jsonl", tmp_path / f"{b}_alone.jsonl") for b in budgets}
    writers = {b: LogWriter(logs[b][0]) for b in budgets}
    fleets = {b: Fleet(workload, [ReplicaSpec(small_config(budget=b), model, writers[b])]) for b in budgets}
    for b in budgets:
        with writers[b]:
            fleets[b].run()
        with LogWriter(logs[b][1]) as w:
            Fleet(workload, [ReplicaSpec(small_config(budget=b), _padded(), w)]).run()
        assert logs[b][0].read_bytes() == logs[b][1].read_bytes()
    assert model.padding == StepPadding(256)


def _padded() -> LinearCostModel:
    """The TRUE model, fitted on steps padded up to 256 tokens."""
    model = LinearCostModel(TRUE)
    model = model.with_step_padding(StepPadding(256))
    return model


def test_the_simulated_log_carries_the_padding_cost(tmp_path):
    """Same workload, same budget: the padded model's prefill steps take longer by exactly their
    padding times its coefficient; decode-only steps are unchanged."""
    from traces.events import Step
    from traces.log import read_log

    padded = LinearCostModel(TRUE)
    padded = padded.with_step_padding(StepPadding(256))
    events = {}
    for name, model in (("padded", padded), ("plain", LinearCostModel(TRUE))):
        with LogWriter(tmp_path / f"{name}.jsonl") as w:
            simulate(mixed_workload(60, seed=2), small_config(), model, sink=w)
        events[name] = [ev for ev in read_log(tmp_path / f"{name}.jsonl") if isinstance(ev, Step)]
    prefill = [ev for ev in events["padded"] if any(s.num_tokens > 1 for s in ev.spans)]
    assert prefill
    for ev in prefill:
        pad = StepPadding(256).padding(sum(s.num_tokens for s in ev.spans))
        unpadded = LinearCostModel(TRUE).step_time(0, ev.spans)
        assert ev.end - ev.start == pytest.approx(unpadded + pad * TRUE["padded_tokens"])


def test_the_padding_cost_is_found_within_logs_whatever_their_levels(tmp_path):
    """Two logs whose steps cost the same but for a per-step level (another machine's const): the
    within-log estimate still finds the padded tokens' cost, and the fit takes it as given."""
    from simulator.cost.padding_cost import padding_cost

    logs = []
    for name, const, budget in (("a.jsonl", 0.004, 256), ("b.jsonl", 0.009, 512)):
        truth = LinearCostModel({**TRUE, "const": const})
        truth = truth.with_step_padding(StepPadding(budget))
        logs.append(_log(tmp_path / name, truth, GPU, budget=budget))
    data = StepData.from_logs(logs)
    cost = padding_cost(data.features, data.durations, data.log_index)
    assert cost == pytest.approx(TRUE["padded_tokens"], rel=1e-6)
    assert LinearCostModel.fit(data, weighting="absolute").coefficients["padded_tokens"] == cost
    unpadded = data.features.copy()
    unpadded[:, PAD] = 0
    assert padding_cost(unpadded, data.durations, None) == 0  # nothing padded: nothing to estimate


def test_the_trees_never_split_on_the_padding(tmp_path):
    truth = LinearCostModel(TRUE)
    truth = truth.with_step_padding(StepPadding(256))
    data = StepData.from_logs([_log(tmp_path / "a.jsonl", truth, GPU)])
    for kind in ("gbm", "linear+gbm"):
        model = fit_candidate(kind, data)
        assert all(f != PAD for tree in model.ensemble.trees for f in tree.feature)


@pytest.mark.parametrize("bad", [{"max_tokens": 0}, {"tokens": 2048}, {"max_tokens": "many"}])
def test_a_malformed_step_padding_in_a_model_file_is_named(tmp_path, bad):
    model = LinearCostModel(TRUE)
    model = model.with_step_padding(StepPadding(2048))
    model.save(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["step_padding"] = bad
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match="step_padding"):
        load_cost_model(tmp_path / "m.json")
