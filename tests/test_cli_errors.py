"""User errors on the command line: a bad flag value is one line ``minivllm: error: --flag: ...``
with exit status 2 and no traceback, whatever the command; an unknown flag gets the subcommand's
usage; nothing to run or analyze (an empty log, a zero-request workload) is an error too."""

from __future__ import annotations

import pytest

from runtime.cli import main
from runtime.cli.config_flags import _flag_fields
from tests.sim_helpers import DATA

AZURE = str(DATA / "azure_conv_head200.csv")
LIVE_GROUPS = ("runner", "cache", "scheduler", "")

# a bad value for every engine flag that takes one (the bools take none argparse would let through)
BAD_CONFIG = {
    "runner.device": "tpu", "runner.dtype": "float8", "runner.attention_backend": "flash",
    "runner.kv_cache_gb": "0", "runner.gpu_memory_utilization": "1.5", "runner.cpu_threads": "-1",
    "runner.sampler": "flashinfer",
    "cache.block_size": "12",
    "cache.num_blocks": "0", "scheduler.max_num_batched_tokens": "0", "scheduler.max_num_seqs": "-1",
    "scheduler.policy": "lifo", "scheduler.max_model_len": "0", "speculative": "ngram:0",
}


def _config_flags(groups):
    """(flag, bad value) of every non-bool engine flag of ``groups``."""
    out = []
    for dotted, f, kind in _flag_fields(groups):
        if kind is bool or f.name == "seed":  # seed: any integer is fine
            continue
        out.append(("--" + f.name.replace("_", "-"), BAD_CONFIG[dotted]))
    return out


def test_every_engine_flag_has_a_bad_value_here():
    assert {d for d, f, k in _flag_fields(LIVE_GROUPS) if k is not bool and d != "seed"} == set(BAD_CONFIG)


# command line (without the flag) -> its own flags' bad values
SIMULATE = ["simulate", AZURE, "--cost-model", "smollm2-135m-cpu", "--out", "/dev/null", "--no-progress"]
WORKLOAD_FLAGS = [("--limit", "-1"), ("--limit", "0"), ("--rate-scale", "0"), ("--rate-scale", "nan"),
                  ("--input-scale", "0"), ("--output-scale", "-1"), ("--time-window", "5:1")]
COMMANDS = {
    "simulate": (SIMULATE, ("cache", "scheduler", ""), [*WORKLOAD_FLAGS, ("--cost-model", "nope")]),
    "workload convert": (["workload", "convert", AZURE, "--out", "/dev/null"], (), WORKLOAD_FLAGS),
    "workload info": (["workload", "info", AZURE], (), WORKLOAD_FLAGS),
    "workload generate": (["workload", "generate", "-n", "5", "--rate", "1", "--out", "/dev/null"], (), [
        ("--num-requests", "0"), ("--rate", "0"), ("--cv", "-1"), ("--shared-prefix", "-1"),
        ("--input-len", "bogus"), ("--output-len", "uniform:5:1"), ("--input-len", "trace:/no/such:input")]),
    "replay": (["replay", str(DATA / "mooncake_head200.jsonl"), "--execute"], ("runner",), []),
    "replay timing": (["replay", str(DATA / "mooncake_head200.jsonl")], (), [("--cost-model", "nope")]),
    "cost-model fit": (["cost-model", "fit", "/dev/null", "--out", "/dev/null"], (), [
        ("--holdout-every", "0"), ("--holdout-every", "1")]),
    "cost-model analytic": (["cost-model", "analytic", "qwen3-0.6b-h200", "--out", "/dev/null"], (), [
        ("--step-overhead", "-1")]),
    "profile": (["profile", "--quick", "--out", "/dev/null"], LIVE_GROUPS, [
        ("--max-context", "0"), ("--max-batch", "0"), ("--time-limit", "-1"), ("--quiet-wait", "-1"),
        ("--holdout-every", "1"), ("--co-located", "1"), ("--co-located-time", "0")]),
    "generate": (["generate", "hi"], LIVE_GROUPS, [
        ("--max-tokens", "0"), ("--min-tokens", "-1"), ("--temperature", "-1"), ("--top-p", "0"),
        ("--top-k", "-1"), ("--min-p", "2"), ("--presence-penalty", "3"), ("--frequency-penalty", "-3"),
        ("--repetition-penalty", "0"), ("--logprobs", "21"), ("--stop", ""), ("--prompts-file", "/no/such")]),
    "bench throughput": (["bench", "throughput"], LIVE_GROUPS, [
        ("--num-prompts", "0"), ("--static-batch", "0"), ("--threads", "0"), ("--hf-peers", "bogus")]),
    "bench profile": (["bench", "profile"], LIVE_GROUPS, [("--num-prompts", "0")]),
    "bench sim": (["bench", "sim", "--trace", AZURE, "--out-dir", "/dev/null"], (), [
        ("--limit", "0"), ("--cost-model", "nope")]),
    "bench core": (["bench", "core"], (), [("--steps", "0")]),
    "bench serve": (["bench", "serve", "--synthetic", "2", "--url", "http://127.0.0.1:9/v1"], (), [
        ("--input-len", "bogus:1"), ("--output-len", "uniform:5"), ("--shared-prefix", "-1"), ("--rate", "0"),
        ("--client-processes", "0")]),
    "demo": (["demo", "--out", "/dev/null"], (), [("--requests", "0"), ("--rate", "0"),
                                                   ("--max-num-batched-tokens", "0"), ("--cost-model", "nope"),
                                                   ("--draws", "0")]),
    "fidelity-table": (["fidelity-table", "--cost-model", "smollm2-135m-cpu", "--run", f"fit:{AZURE}"], (), [
        ("--sensitivity", "0"), ("--cost-model", "nope"), ("--run", AZURE), ("--pair", f"a:{AZURE}"),
        ("--repeat", AZURE)]),
    "bench matrix": (["bench", "matrix", AZURE, "--out", "/dev/null"], (), [
        ("--loads", "0.5,x"), ("--loads", "0"), ("--chunked", "sometimes"), ("--slo", "ttft=1"), ("--limit", "1"),
        ("--capacity", "0"), ("--client-processes", "0")]),
    "serve": (["serve"], (), [("--port", "65536"), ("--port", "-1"), ("--model", "random:b random:a")]),
}
CASES = [pytest.param(argv, flag, value, id=f"{name} {flag} {value}")
         for name, (argv, groups, own) in COMMANDS.items()
         for flag, value in [*_config_flags(groups), *own]]
# two-value flags
CASES += [pytest.param(["bench", cmd], flag, value, id=f"bench {cmd} {flag} {value}")
          for cmd in ("throughput", "profile")
          for flag, value in (("--input-len", "0 5"), ("--output-len", "5 1"))]


@pytest.mark.parametrize(("argv", "flag", "value"), CASES)
def test_a_bad_flag_value_is_one_line_naming_the_flag(argv, flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, flag, *value.split(" ")])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"minivllm: error: {flag}: "), err


@pytest.mark.parametrize("argv", [
    ["simulate", "w.csv", "--cost-model", "m", "--out", "o.jsonl"],
    ["workload", "convert", "w.csv", "--out", "o.jsonl"],
    ["bench", "sim"],
    ["cost-model", "eval", "m.json", "a.jsonl"],
    ["analyze", "a.jsonl"],
], ids=lambda argv: " ".join(argv[:2]))
def test_an_unknown_flag_is_one_line_naming_the_subcommand(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--bogus", "7"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    command = " ".join(a for a in argv[:2] if not a.endswith((".csv", ".jsonl", ".json")))
    assert err == (f"minivllm {command}: error: unrecognized arguments: --bogus 7 "
                   f"(see minivllm {command} --help)\n")


@pytest.mark.parametrize(("typo", "meant"), [("--max-num-seq", "--max-num-seqs"), ("--chunkd", "--chunked"),
                                             ("--cost-modle", "--cost-model")])
def test_a_typo_or_an_abbreviation_is_refused_with_the_nearest_flag(typo, meant, capsys):
    """``--max-num-seq`` is not taken for ``--max-num-seqs`` (argparse would, silently)."""
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "w.csv", "--cost-model", "m", "--out", "o.jsonl", typo, "4"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"unrecognized arguments: {typo} 4 (did you mean {meant}?)" in err


def _fails(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    return err.strip()


def test_analyze_with_nothing_to_analyze_is_an_error(tmp_path, capsys):
    from traces.events import Header, Step
    from traces.log import LogWriter

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _fails(["analyze", str(empty)], capsys) == f"minivllm: error: {empty}: empty file"
    header_only = tmp_path / "header.jsonl"
    with LogWriter(header_only) as w:
        w(Header(clock="sim"))
    assert "no requests in the log (0 steps)" in _fails(["analyze", str(header_only)], capsys)
    steps_only = tmp_path / "steps.jsonl.gz"
    with LogWriter(steps_only) as w:
        w(Header(clock="sim"))
        w(Step(step=0, start=0.0, end=1.0, spans=[], tokens=[]))
    assert "no requests in the log (1 steps)" in _fails(["analyze", str(steps_only)], capsys)
    assert f"{AZURE}:1: " in _fails(["analyze", AZURE], capsys)  # not JSON: the reader names the line


def test_simulate_of_no_requests_is_an_error(tmp_path, capsys):
    from traces.workload import Workload

    empty = tmp_path / "w.jsonl"
    Workload([]).save(empty)
    out = tmp_path / "o.jsonl"
    err = _fails(["simulate", str(empty), "--cost-model", "smollm2-135m-cpu", "--out", str(out)], capsys)
    assert err == f"minivllm: error: {empty}: no requests"
    err = _fails(["simulate", AZURE, "--cost-model", "smollm2-135m-cpu", "--out", str(out),
                  "--time-window", "10000:20000"], capsys)
    assert err == f"minivllm: error: {AZURE}: no requests (after --time-window)"
    assert not out.exists()


def test_skip_bad_rows_with_every_row_bad_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,x,2\n2023-11-16 18:17:04,0,2\n")
    err = _fails(["workload", "convert", str(bad), "--skip-bad-rows", "--out", str(tmp_path / "w.jsonl")], capsys)
    assert err == (f"minivllm: error: no valid rows in {bad} (2 skipped; first: {bad}:2: field ContextTokens: "
                   "must be a positive integer, got 'x')")


def test_an_output_path_that_is_a_folder_is_one_line(tmp_path, capsys):
    err = _fails(["simulate", AZURE, "--cost-model", "smollm2-135m-cpu", "--limit", "3", "--no-progress",
                  "--out", str(tmp_path)], capsys)
    assert err.endswith(f"{tmp_path}: Is a directory")


@pytest.mark.parametrize("command", [["sweep"], ["search", "--slo", "ttft_p99_ms=100"]], ids=lambda c: c[0])
@pytest.mark.parametrize("speculative", [["--grid", "speculative=off,ngram:4"], ["--speculative", "ngram:2"]],
                         ids=["axis", "flag"])
def test_a_speculative_plan_with_no_acceptance_rates_is_one_line_before_any_simulation(command, speculative, tmp_path,
                                                                                       capsys):
    out = tmp_path / "out"
    err = _fails([command[0], AZURE, "--cost-model", "smollm2-135m-cpu", "--limit", "20", *command[1:], *speculative,
                  "--in-process", "--no-progress", "--out", str(out)], capsys)
    assert err.startswith("minivllm: error: --speculative: ") and "--acceptance RATE" in err
    assert len(err.splitlines()) == 1 and not out.exists()
