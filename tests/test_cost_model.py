"""Cost models: features, NNLS fit (recovers a known model), JSON, recorded durations, the shipped model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.cost.cost_model import CostModel, CostModelError
from simulator.cost.features import EXT_FEATURES, FEATURES, ext_features, step_features
from simulator.cost.linear_model import MISSING_COEFFICIENT, LinearCostModel
from simulator.cost.loading import load_cost_model, shipped_cost_models
from simulator.cost.nnls import nnls
from simulator.cost.recorded_model import RecordedCostModel
from simulator.cost.roofline import H200, QWEN3_0_6B, analytic_cost_model
from simulator.cost.step_data import StepData
from simulator.sim import simulate
from tests.sim_helpers import mixed_workload, small_config
from traces.decode_splits import DecodeSplits
from traces.events import Span
from traces.log import LogWriter
from traces.step_padding import StepPadding

TRUE = {"const": 0.004, "prefill_tokens": 3e-5, "prefill_attention": 2e-9, "decode_seqs": 2e-4,
        "decode_context": 4e-7, "seqs": 1e-4, "prefill_step": 0.012, "longest_program": 3e-7}
SIX = ("const", "prefill_tokens", "prefill_attention", "decode_seqs", "decode_context", "seqs")  # before prefill_step


def test_features_of_a_step():
    spans = [Span(0, 100, 1, True), Span(1, 7, 1, True), Span(2, 16, 32, False), Span(3, 0, 5, True)]
    f = dict(zip(FEATURES, step_features(spans)))
    assert f == {"const": 1.0, "prefill_tokens": 37, "prefill_attention": 32 * 16 + 32 * 33 // 2 + 5 * 6 // 2,
                 "decode_seqs": 2, "decode_context": 101 + 8, "seqs": 4, "prefill_step": 1.0, "longest_program": 101,
                 "padded_tokens": 0}
    model = LinearCostModel(TRUE)
    expected = float(np.dot([TRUE.get(k, 0.0) for k in FEATURES], list(f.values())))
    assert model.step_time(0, spans) == pytest.approx(expected)
    # the trees' extras: tokens, prefill spans, the largest chunk
    assert dict(zip(EXT_FEATURES, ext_features(spans)))["max_chunk"] == 32
    assert ext_features(spans)[:len(FEATURES)] == step_features(spans)
    assert dict(zip(FEATURES, step_features([Span(2, 16, 32, False)])))["longest_program"] == 0


def test_a_verify_span_is_decode_rows_reading_its_context_once():
    """A speculating request's span of 1 + 8 tokens over 1,450 cached: 9 decode rows (the decode graph
    runs a row per token), its context read once and its last row the longest program, no prefill
    chunk's tokens or query-key pairs; a step of decodes and verify spans is a decode step."""
    spans = [Span(0, 1450, 9, True), Span(1, 300, 1, True), Span(2, 16, 9, True)]
    plain = dict(zip(FEATURES, step_features(spans)))
    verify = dict(zip(FEATURES, step_features(spans, verifying={0})))
    assert plain["prefill_attention"] == 9 * 1450 + 45 + 9 * 16 + 45 and plain["decode_context"] == 301
    assert verify["prefill_attention"] == 9 * 16 + 45 and verify["prefill_tokens"] == 9
    assert verify["decode_seqs"] == 1 + 9 and verify["seqs"] == 3 and verify["decode_context"] == 301 + 1450 + 9
    assert verify["longest_program"] == 1450 + 9 and verify["prefill_step"] == 1.0
    rows = dict(zip(FEATURES, step_features(spans[:2], verifying={0})))
    assert rows["prefill_step"] == rows["prefill_tokens"] == 0
    padded = {**TRUE, "padded_tokens": 1e-6}
    model = LinearCostModel(padded)  # its inlined features agree, padding too
    model = model.with_step_padding(StepPadding(2048))
    for s, v in ((spans, {0}), (spans, ()), (spans[:2], {0}), (spans, {0, 2})):
        expected = float(np.dot([padded.get(k, 0.0) for k in FEATURES],
                                step_features(s, padding=StepPadding(2048), verifying=v)))
        assert model.step_time(0, s, v) == pytest.approx(expected)


def test_longest_program_follows_the_decode_kernels_split():
    """With the H200's policy (8 KV heads, 132 SMs) a 6,000-token decode among 7 is split 8 ways;
    among 100 it is not split, and the step waits for the whole of it."""
    choose_num_splits = pytest.importorskip("runtime.executor.kernels.paged_attention").choose_num_splits
    h200 = DecodeSplits(num_kv_heads=8, sms=132)
    few = [Span(0, 5999, 1, True)] + [Span(i, 999, 1, True) for i in range(1, 7)]
    many = [Span(0, 5999, 1, True)] + [Span(i, 999, 1, True) for i in range(1, 100)]
    longest = FEATURES.index("longest_program")
    assert step_features(few)[longest] == step_features(many)[longest] == 6000  # not split
    assert step_features(few, h200)[longest] == 750 and step_features(many, h200)[longest] == 6000
    for n in (7, 100):  # the kernel's own choice
        assert h200.longest_program(6000, n) == -(-6000 // choose_num_splits(n, 8, 6000, 132))
    model = LinearCostModel(TRUE)
    model = model.with_decode_splits(h200)
    for spans in (few, many, few + [Span(200, 16, 32, False)]):
        expected = float(np.dot([TRUE.get(k, 0.0) for k in FEATURES], step_features(spans, h200)))
        assert model.step_time(0, spans) == pytest.approx(expected)


def test_the_split_policy_comes_from_the_logs_headers(tmp_path):
    """A GPU log's header names the Triton kernel, its KV heads and SMs; a CPU log's does not split.
    A model fitted on the GPU log keeps the policy in its file; logs of both cannot be one fit."""
    from runtime.cli.cost_model import fit_logs
    from traces.events import Header, make_header

    def log(path, extra):
        with LogWriter(path) as w:
            simulate(mixed_workload(8, seed=3), small_config(), LinearCostModel(TRUE), sink=lambda ev: w(
                make_header(small_config(), clock="wall", extra=extra) if isinstance(ev, Header) else ev))
        return str(path)

    kv = {"num_layers": 2, "num_kv_heads": 8, "head_dim": 64, "block_size": 16, "num_blocks": 64}
    gpu = log(tmp_path / "gpu.jsonl", {"attention_backend": "triton", "kv": kv, "sms": 132})
    cpu = log(tmp_path / "cpu.jsonl", {"attention_backend": "torch", "kv": kv})
    assert StepData.from_logs([gpu]).decode_splits == DecodeSplits(8, 132)
    assert StepData.from_logs([cpu]).decode_splits is None
    with pytest.raises(CostModelError, match="different decode kernels"):
        StepData.from_logs([gpu, cpu])
    model = fit_logs([gpu], kind="linear-absolute")
    model.save(tmp_path / "m.json")
    assert load_cost_model(str(tmp_path / "m.json")).decode_splits == DecodeSplits(8, 132)


def test_prefill_step_is_one_when_any_span_prefills():
    decode = [Span(0, 100, 1, True), Span(1, 7, 1, True)]
    assert dict(zip(FEATURES, step_features(decode)))["prefill_step"] == 0.0
    for prefill in ([Span(2, 0, 2, False)], [*decode, Span(2, 16, 512, True)]):
        assert dict(zip(FEATURES, step_features(prefill)))["prefill_step"] == 1.0
    model = LinearCostModel(TRUE)
    without = LinearCostModel({k: v for k, v in TRUE.items() if k != "prefill_step"})
    assert model.step_time(0, decode) == without.step_time(0, decode)
    mixed = [*decode, Span(2, 0, 2, False)]
    assert model.step_time(0, mixed) == pytest.approx(without.step_time(0, mixed) + TRUE["prefill_step"])


def test_nnls_matches_brute_force_over_active_sets():
    rng = np.random.default_rng(0)
    for _ in range(50):
        A, b = rng.normal(size=(30, 4)), rng.normal(size=30)
        x = nnls(A, b)
        best = np.linalg.norm(b)  # x = 0
        for k in range(1, 16):
            m = np.array([bool(k >> i & 1) for i in range(4)])
            sol = np.linalg.lstsq(A[:, m], b, rcond=None)[0]
            if (sol >= 0).all():
                best = min(best, float(np.linalg.norm(A[:, m] @ sol - b)))
        assert (x >= 0).all() and np.linalg.norm(A @ x - b) <= best + 1e-9


def _log_with(tmp_path, model, name, seed, **cfg):
    path = tmp_path / name
    with LogWriter(path) as w:
        simulate(mixed_workload(120, seed=seed, rate=60), small_config(**cfg), model, sink=w)
    return path


def test_fit_recovers_the_model_that_timed_the_log(tmp_path):
    truth = LinearCostModel(TRUE)
    train = [_log_with(tmp_path, truth, "a.jsonl", 1),
             _log_with(tmp_path, truth, "b.jsonl", 2, chunked=False, budget=1024)]
    held = _log_with(tmp_path, truth, "c.jsonl", 3, num_blocks=48, budget=128)
    fit = LinearCostModel.fit(StepData.from_logs(train))
    assert fit.meta["training"]["mape"] < 1e-6
    assert fit.evaluate(StepData.from_logs([held]))["mape"] < 1e-6
    for k in FEATURES:
        assert fit.coefficients[k] == pytest.approx(TRUE.get(k, 0.0), rel=1e-4, abs=1e-15)


def test_fit_with_noise_is_nonnegative_and_reports_heldout_error(tmp_path):
    class Noisy(CostModel):
        def __init__(self):
            self.rng = np.random.default_rng(0)

        def step_time(self, step, spans, verifying=()):
            return LinearCostModel(TRUE).step_time(step, spans) * float(self.rng.uniform(0.9, 1.1))

    logs = [_log_with(tmp_path, Noisy(), f"{i}.jsonl", i) for i in range(2)]
    data = StepData.from_logs(logs)
    train, held = data.split(5)
    assert len(held.durations) == len(data.durations) // 5
    fit = LinearCostModel.fit(train)
    assert all(v >= 0 for v in fit.coefficients.values())
    ev = fit.evaluate(data)
    assert ev["mape"] < 6 and set(ev["per_log"]) == {str(p) for p in logs}


def test_unexercised_features_are_reported_not_invented(tmp_path):
    from traces.events import Header, Step

    path = tmp_path / "decode.jsonl"
    with LogWriter(path) as w:
        w(Header())
        for i in range(20):
            spans = [Span(j, 50 + i, 1, True) for j in range(1 + i % 4)]
            w(Step(step=i, start=float(i), end=i + 0.001 * len(spans), spans=spans, tokens=[[1]] * len(spans)))
    fit = LinearCostModel.fit(StepData.from_logs([path]))
    assert set(fit.meta["unfitted_features"]) == {"prefill_tokens", "prefill_attention", "prefill_step",
                                                    "padded_tokens"}
    assert fit.coefficients["prefill_tokens"] == 0.0 and fit.coefficients["prefill_step"] == 0.0


def test_json_roundtrip_and_errors(tmp_path):
    m = LinearCostModel(TRUE, {"model_identity": "m", "hardware": "h", "dtype": "bf16", "fit_date": "d"})
    path = tmp_path / "m.json"
    m.save(path)
    back = LinearCostModel.load(path)
    assert back.coefficients == m.coefficients and back.meta["hardware"] == "h"
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "minivllm-cost-model", "kind": "linear", "coefficients": {"warp": 1}}')
    with pytest.raises(CostModelError, match="unknown cost-model features"):
        LinearCostModel.load(bad)
    bad.write_text('{"format": "minivllm-cost-model", "kind": "linear", "coefficients": {"const": -1}}')
    with pytest.raises(CostModelError, match=">= 0"):
        LinearCostModel.load(bad)
    bad.write_text("{oops")
    with pytest.raises(CostModelError, match="not JSON"):
        LinearCostModel.load(bad)
    with pytest.raises(FileNotFoundError, match="qwen3-0.6b-h200"):
        load_cost_model(tmp_path / "nope.json")


def test_a_file_without_a_newer_feature_loads_with_it_at_zero(tmp_path):
    """Files written before prefill_step existed (six coefficients) load; the missing one is 0."""
    assert MISSING_COEFFICIENT == 0.0
    six = {k: TRUE[k] for k in SIX}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "minivllm-cost-model", "version": 1, "kind": "linear",
                               "hardware": "h", "features": {k: "" for k in SIX}, "coefficients": six}))
    m = LinearCostModel.load(old)
    assert m.coefficients == {**six, "prefill_step": 0.0, "longest_program": 0.0, "padded_tokens": 0.0}
    assert m.defaulted_features == ["prefill_step", "longest_program", "padded_tokens"]
    spans = [Span(0, 100, 1, True), Span(1, 0, 64, True)]
    f = dict(zip(FEATURES, step_features(spans)))
    assert f["prefill_step"] == 1.0
    assert m.step_time(0, spans) == pytest.approx(sum(six[k] * f[k] for k in SIX))  # as before the feature
    m.save(tmp_path / "resaved.json")  # written back, the coefficient is explicit
    assert json.loads((tmp_path / "resaved.json").read_text())["coefficients"]["prefill_step"] == 0.0
    assert LinearCostModel.load(tmp_path / "resaved.json").defaulted_features == []


def test_recorded_model_returns_logged_durations(tmp_path):
    path = _log_with(tmp_path, LinearCostModel(TRUE), "r.jsonl", 4)
    rec = RecordedCostModel.from_log(path)
    data = StepData.from_logs([path])
    assert [rec.step_time(i, []) for i in range(len(data.durations))] == data.durations.tolist()
    with pytest.raises(CostModelError, match="diverged"):
        rec.step_time(len(data.durations), [])
    assert isinstance(load_cost_model(f"recorded:{path}"), RecordedCostModel)


def test_shipped_h200_model_is_a_fit_with_its_held_out_error():
    """Fitted in the live regime: served runs (overlapped steps, piecewise CUDA graphs for
    prefill) of two workloads plus a profile sweep; host timing and intake from the served runs."""
    assert "qwen3-0.6b-h200" in shipped_cost_models()
    m = load_cost_model("qwen3-0.6b-h200")
    doc = json.loads((Path(__import__("simulator").__file__).parent / "cost" / "cost_models" / "qwen3-0.6b-h200.json"
                      ).read_text())
    assert doc["provenance"] == "fit" and doc["hardware"] == "NVIDIA H200" and doc["dtype"] == "bfloat16"
    assert doc["heldout"]["steps"] > 100 and 0 < doc["heldout"]["mape"] < 20  # 9.1%
    assert doc["candidate"] == "linear+gbm" and "fit_profile" in doc["command"]
    assert all(v >= 0 for v in m.coefficients.values()) and m.coefficients["const"] > 0
    assert set(doc["coefficients"]) == set(FEATURES) and doc["tree_features"] == list(EXT_FEATURES)
    assert doc["software"]["torch"] and any("fit_profile" in log for log in doc["training"]["logs"])
    assert m.host.overlap and 0.001 < m.intake_delay < 0.05 and "intake" in doc["calibration"]
    # ranges keep the profile's (decode batches up to 256, whole prompts to 8,191) and the live runs'
    assert doc["ranges"]["seqs"][1] >= 256 and doc["ranges"]["prefill_tokens"][1] >= 8000
    # prefill steps run piecewise CUDA graphs now: a small mixed step costs a few ms, like a decode step
    small_mixed = m.step_time(0, [Span(0, 500, 1, True), Span(1, 0, 16, True)])
    assert small_mixed < 0.008
    assert m.step_time(0, [Span(i, 2000, 1, True) for i in range(200)]) > m.step_time(0, [Span(0, 500, 1, True)])
    # a served decode batch with one long sequence costs more than one of equal size and context sum
    even = [Span(i, 1200, 1, True) for i in range(64)]
    one_long = [Span(0, 6051, 1, True)] + [Span(i, 1123, 1, True) for i in range(1, 64)]
    assert sum(s.start for s in even) == sum(s.start for s in one_long)
    assert m.step_time(0, one_long) > m.step_time(0, even) + 0.001


def test_shipped_h200_fit_reproduces_from_its_logs():
    """The shipped coefficients are what the recorded command gives on its logs (tests/data/h200/fit_*)."""
    from runtime.cli.cost_model import fit_logs

    shipped = load_cost_model("qwen3-0.6b-h200")
    root = Path(__file__).resolve().parents[1]
    logs = [str(root / log) for log in shipped.meta["training"]["logs"]]
    weights = {str(root / log): n for log, n in shipped.meta["training"].get("weights", {}).items()}
    again = fit_logs(logs, kind="linear+gbm", weights=weights, refit=False)  # (it keeps its held-out blocks out)
    factor = shipped.meta["calibration"]["factor"]  # the level from the served runs (--calibrate)
    for k in FEATURES:
        assert again.coefficients[k] * factor == pytest.approx(shipped.coefficients[k], rel=1e-6, abs=1e-15)


def test_analytic_h200_roofline():
    m = analytic_cost_model(QWEN3_0_6B, H200)
    assert m.coefficients["prefill_step"] == 0.0 and m.defaulted_features == []  # a roofline sees no eager cost
    # weights 1.19 GB at 4.3 TB/s + 1 ms assumed overhead
    assert m.coefficients["const"] == pytest.approx(1.19e9 / 4.3e12 + 1e-3, rel=0.01)
    decode_256 = m.step_time(0, [Span(i, 1000, 1, True) for i in range(256)])
    assert 5e-3 < decode_256 < 20e-3
