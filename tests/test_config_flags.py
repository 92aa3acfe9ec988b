"""Engine flags come from the config dataclasses: every option field is a flag with the field's
default in its help, set flags map back to dotted config names, and errors name the flag."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.cli import build_parser, main
from runtime.cli.config_flags import config_options, engine_options
from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.executor.config import RunnerConfig
from tests.sim_helpers import REPO

LIVE = {"runner": RunnerConfig, "cache": CacheConfig, "scheduler": SchedulerConfig, "": EngineConfig}


def subparser(name: str):
    parser = build_parser()
    return next(a for a in parser._subparsers._group_actions if a.dest == "command").choices[name]


def option_fields(cls):
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli")]


@pytest.mark.parametrize("command", ["serve", "generate", "profile"])
def test_every_option_field_is_a_flag_with_its_default(command):
    text = subparser(command).format_help().replace("\n", " ")
    text = " ".join(text.split())
    for cls in LIVE.values():
        for f in option_fields(cls):
            flag = "--" + f.name.replace("_", "-")
            assert flag in text, flag
            assert " ".join(f.metadata["help"].split()[:3]) in text, f.name


def test_set_flags_become_dotted_config_names():
    args = build_parser().parse_args(
        ["generate", "hi", "--max-num-seqs", "8", "--no-chunked-prefill", "--policy", "priority",
         "--no-enable-prefix-caching", "--dtype", "bfloat16", "--enforce-eager", "--seed", "3"])
    assert config_options(args) == {
        "scheduler.max_num_seqs": 8, "scheduler.enable_chunked_prefill": False, "scheduler.policy": "priority",
        "cache.enable_prefix_caching": False, "runner.dtype": "bfloat16", "runner.enforce_eager": True, "seed": 3}
    assert engine_options(args)["max_num_seqs"] == 8
    assert config_options(build_parser().parse_args(["generate", "hi"])) == {}  # nothing set: the fields' defaults
    on_off = build_parser().parse_args(["simulate", "w.jsonl", "--cost-model", "m", "--out", "o", "--chunked", "off",
                                        "--prefix-caching", "on"])
    assert config_options(on_off) == {"scheduler.enable_chunked_prefill": False, "cache.enable_prefix_caching": True}


@pytest.mark.parametrize(("flags", "needle"), [
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens: scheduler.max_num_batched_tokens"),
    (["--policy", "lifo"], "--policy: scheduler.policy"),
    (["--block-size", "12"], "--block-size: cache.block_size"),
])
def test_config_errors_name_the_flag(flags, needle, capsys):
    workload = str(REPO / "tests" / "data" / "azure_conv_head200.csv")
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", workload, "--cost-model", "smollm2-135m-cpu", "--out", "/dev/null", *flags])
    assert exit_.value.code == 2
    assert needle in capsys.readouterr().err


def test_bad_on_off_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "w", "--cost-model", "m", "--out", "o", "--chunked", "maybe"])
    assert "expected on or off" in capsys.readouterr().err
