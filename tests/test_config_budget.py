"""The step budget's one rule (runtime/engine/config.py), as vLLM has it: not given, it is 2048 with
chunked prefill and max(max_model_len, 2048) without (a whole prompt fits a step); given, it is
what was given. A derived config (a what-if, simulate's flags over a log) treats a budget it
doesn't give as not given when chunked prefill changes. Every command gets the same budget from
the same flags: serve and generate (build_engine), profile, bench sim, simulate."""

from __future__ import annotations

import argparse

import pytest

from runtime.engine.config import EngineConfig, SchedulerConfig, default_batched_tokens
from simulator.fidelity.config_diff import config_changes, what_if


@pytest.mark.parametrize(("chunked", "max_model_len", "budget"),
                         [(True, 4096, 2048), (True, 512, 2048), (False, 8192, 8192), (False, 1024, 2048)])
def test_an_unset_budget_follows_chunked_prefill(chunked, max_model_len, budget):
    assert default_batched_tokens(chunked, max_model_len) == budget
    sched = SchedulerConfig(enable_chunked_prefill=chunked, max_model_len=max_model_len)
    assert sched.max_num_batched_tokens == budget
    assert SchedulerConfig(max_num_batched_tokens=384, enable_chunked_prefill=chunked,
                           max_model_len=max_model_len).max_num_batched_tokens == 384  # given: kept
    assert EngineConfig.from_dict(EngineConfig(scheduler=sched).to_dict()).scheduler == sched


def test_a_derived_config_rederives_the_budget_only_when_chunking_changes_and_the_budget_is_not_given():
    on = SchedulerConfig(max_num_batched_tokens=64, max_model_len=8192)
    assert on.replace(enable_chunked_prefill=False).max_num_batched_tokens == 8192
    assert on.replace(enable_chunked_prefill=False, max_num_batched_tokens=100).max_num_batched_tokens == 100
    assert on.replace(max_model_len=1024).max_num_batched_tokens == 64  # chunked stays on: kept
    assert on.replace(max_num_seqs=8).max_num_batched_tokens == 64
    off = SchedulerConfig(max_num_batched_tokens=384, enable_chunked_prefill=False, max_model_len=1024)
    assert off.replace(max_num_seqs=8).max_num_batched_tokens == 384  # a log's own config: as recorded
    assert off.replace(max_model_len=16384).max_num_batched_tokens == 16384
    assert off.replace(enable_chunked_prefill=True).max_num_batched_tokens == 2048
    cfg = EngineConfig(scheduler=on)
    new = what_if(cfg, ["scheduler.enable_chunked_prefill=false"])
    assert new.scheduler.max_num_batched_tokens == 8192
    assert "chunked prefill off: max_num_batched_tokens 64 → 8,192 so a whole prompt fits a step" in \
        config_changes(cfg, new)


def _flags(command: list[str]) -> argparse.Namespace:
    from runtime.cli import build_parser

    return build_parser().parse_args(command)


def test_simulate_and_bench_sim_and_profile_budgets_agree():
    from runtime.bench.sim_bench import bench_config
    from runtime.cli.simulate import engine_config
    from traces.generators import generate

    wl = generate(4, rate=1.0, input_len="fixed:100", output_len="fixed:4", seed=0)
    for flags, budget in ((["--chunked", "off", "--max-model-len", "16384"], 16384),
                          (["--no-chunked-prefill", "--max-model-len", "1024"], 2048),
                          (["--chunked", "off", "--max-model-len", "1024", "--max-num-batched-tokens", "512"], 512),
                          (["--max-model-len", "16384"], 2048)):
        args = _flags(["simulate", "w.jsonl", "--cost-model", "m", "--out", "o.jsonl", *flags])
        assert engine_config(args, wl).scheduler.max_num_batched_tokens == budget, flags
    assert bench_config(False, 16384).scheduler.max_num_batched_tokens == 16384
    assert bench_config(True, 16384).scheduler.max_num_batched_tokens == 2048


def test_the_live_engine_with_chunked_prefill_off_gets_a_budget_that_holds_a_prompt(tmp_path):
    """serve, generate, bench live/throughput build their engine here, max_model_len resolved first."""
    from runtime.cli.config_flags import engine_options
    from runtime.executor.setup import build_engine
    from tests.model_helpers import make_tiny

    tiny = make_tiny("llama", tmp_path / "m", max_position_embeddings=8192)
    for command in (["serve", "--no-chunked-prefill"], ["generate", "hi", "--chunked", "off"]):
        opts = engine_options(_flags([*command, "--num-blocks", "64", "--max-model-len", "4096"]))
        parts = build_engine(loaded=tiny.loaded, **opts)
        assert parts.config.scheduler.max_num_batched_tokens == 4096, command
    sched = build_engine(loaded=tiny.loaded, num_blocks=64, enable_chunked_prefill=False).config.scheduler
    assert (sched.max_model_len, sched.max_num_batched_tokens) == (4096, 4096)  # max_model_len: its default


def test_profile_with_chunked_prefill_off_profiles_under_the_same_budget(tmp_path):
    from runtime.cli.profile import _engine
    from tests.model_helpers import make_tiny

    tiny = make_tiny("llama", tmp_path / "m", max_position_embeddings=8192)
    args = _flags(["profile", "--model", str(tiny.folder), "--device", "cpu", "--no-chunked-prefill",
                   "--max-model-len", "4096", "--num-blocks", "64", "--quick", "--out", str(tmp_path / "p.jsonl")])
    parts, limits = _engine(args)
    assert parts.config.scheduler.max_num_batched_tokens == limits.budget == 4096
