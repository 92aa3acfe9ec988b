"""``minivllm bench matrix``: the runs it starts (capacity, then bench serve --launch and bench live
per chunked mode × load, the engine flags to both, chunked off by its flag alone: the default
budget holds a whole prompt), the summary it writes, and a failed run as a one-line error. The
runs themselves are stood in for here (bench serve and bench live are tested on their own)."""

from __future__ import annotations

import json

import pytest

from runtime.bench import serve_matrix
from runtime.cli import main
from tests.sim_helpers import DATA

AZURE = str(DATA / "azure_conv_head200.csv")
LATENCY = {"p50": 0.01, "p99": 0.02}


class FakeRuns:
    """Writes what each run would: its JSON summary (the step times are stood in for too)."""

    def __init__(self, fail: str | None = None) -> None:
        self.commands: list[list[str]] = []
        self.fail = fail

    def __call__(self, cmd: list[str]) -> None:
        args = cmd[3:]  # after python -m runtime
        self.commands.append(args)
        if self.fail and self.fail in args:
            raise serve_matrix.RunFailed(f"`{' '.join(args)}` exited with status 1")
        out = args[args.index("--json") + 1]
        ms = {k: v * 1e3 for k, v in LATENCY.items()}
        summary = ({"ttft_ms": ms, "tpot_ms": ms, "itl_ms": ms, "e2e_ms": ms, "send_lag_ms": ms}
                   if args[1] == "serve" else {"request_throughput_req_s": 10.0, "ttft_s": LATENCY,
                                               "tpot_s": LATENCY})
        with open(out, "w") as f:
            json.dump({"summary": summary}, f)


@pytest.fixture
def runs(monkeypatch):
    fake = FakeRuns()
    monkeypatch.setattr(serve_matrix, "run", fake)
    monkeypatch.setattr(serve_matrix, "steps", lambda log: {"mean": 1.0, "p99": 2.0, "max": 3.0, "over_50ms": 0})
    return fake


def test_the_matrix_runs_every_mode_and_load_and_writes_the_table(runs, tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["bench", "matrix", AZURE, "--limit", "50", "--loads", "0.5,1.1", "--out", str(out),
                 "--launch", "--model", "random:x", "--device", "cpu"]) == 0
    kinds = [(c[1], "--no-enable-chunked-prefill" in c) for c in runs.commands]
    assert kinds == [("live", False)] + [("serve", False), ("live", False)] * 2 + [("serve", True), ("live", True)] * 2
    for c in runs.commands:
        assert c[c.index("--model") + 1] == "random:x" and "--max-num-batched-tokens" not in c
    serve = runs.commands[1]
    assert serve[serve.index("--launch") + 1:][:2] == ["--model", "random:x"]  # the engine flags come last
    doc = json.loads((out / "summary.json").read_text())
    assert doc["capacity_req_s"] == 10.0 and [(r["chunked"], r["load"]) for r in doc["rows"]] == [
        ("on", 0.5), ("on", 1.1), ("off", 0.5), ("off", 1.1)]
    table = (out / "summary.md").read_text()
    assert table in capsys.readouterr().out and "| 110% | off | 11.0 |" in table


def test_a_given_capacity_skips_its_run_and_no_live_skips_the_in_process_ones(runs, tmp_path):
    assert main(["bench", "matrix", AZURE, "--limit", "50", "--loads", "0.8", "--chunked", "off", "--capacity", "4",
                 "--no-live", "--out", str(tmp_path)]) == 0
    assert [c[1] for c in runs.commands] == ["serve"]
    assert json.loads((tmp_path / "summary.json").read_text())["rows"][0]["offered_req_s"] == pytest.approx(3.2)


def test_a_failed_run_is_one_line_naming_it(runs, tmp_path, capsys):
    runs.fail = "serve"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "matrix", AZURE, "--limit", "50", "--capacity", "4", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("minivllm: error: bench matrix: `bench serve ") and err.endswith(
        f"exited with status 1; the runs so far are in {tmp_path}")


def test_the_servers_own_flags_go_to_the_served_runs_only(runs, tmp_path):
    assert main(["bench", "matrix", AZURE, "--limit", "50", "--loads", "0.8", "--chunked", "on", "--out", str(tmp_path),
                 "--launch", "--model", "random:x", "--api-server-count", "4", "--max-pending=8", "--no-engine-process",
                 "--max-num-seqs", "64"]) == 0
    assert [c[1] for c in runs.commands] == ["live", "serve", "live"]
    for c in runs.commands:
        flags = c[c.index("--launch") + 1:] if c[1] == "serve" else c
        assert flags[flags.index("--max-num-seqs") + 1] == "64"  # an engine flag: every run
        if c[1] == "serve":
            assert flags[flags.index("--api-server-count") + 1] == "4"
            assert {"--max-pending=8", "--no-engine-process"} <= set(flags)
        else:
            assert not {"--api-server-count", "--max-pending=8", "--no-engine-process"} & set(flags)
            assert flags[flags.index("--model") + 1] == "random:x"
