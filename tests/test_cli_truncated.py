"""A log cut off mid-write (a killed server) is read up to its last complete line: analyze,
replay and simulate run on that and say on stderr how much the reader dropped."""

from __future__ import annotations

import pytest

from runtime.cli import main
from tests.sim_helpers import VaryingDurationExecutor, mixed_workload, record_live, small_config
from traces.log import LogWriter


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cut")
    logs = {}
    for name in ("live.jsonl", "live.jsonl.gz"):
        with LogWriter(folder / name) as w:
            for ev in record_live(mixed_workload(30, seed=3), small_config(num_blocks=40, budget=128),
                                  VaryingDurationExecutor(seed=1)):
                w(ev)
        logs[name] = folder / name
    return logs


def _cut(path, tmp_path, keep):
    cut = tmp_path / ("cut" + "".join(path.suffixes))
    data = path.read_bytes()
    cut.write_bytes(data[:keep(len(data))])
    return cut


def _notices(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("minivllm: warning: ")]


@pytest.mark.parametrize("name", ["live.jsonl", "live.jsonl.gz"])
@pytest.mark.parametrize("argv", [
    ["analyze", "{log}"],
    ["replay", "{log}", "--cost-model", "recorded"],
    ["simulate", "{log}", "--cost-model", "smollm2-135m-cpu", "--no-progress", "--out", "{out}"],
], ids=["analyze", "timing-replay", "simulate"])
def test_a_cut_off_log_is_read_with_a_notice(live, name, argv, tmp_path, capsys):
    cut = _cut(live[name], tmp_path, lambda n: n - 200 if name.endswith(".gz") else n - 25)
    assert main([a.format(log=cut, out=tmp_path / "out.jsonl") for a in argv]) == 0
    notices = _notices(capsys.readouterr().err)
    assert len(notices) == 1 and f"{cut}: " in notices[0] and "dropped the last" in notices[0], notices


def test_a_log_cut_inside_its_header_is_an_error(live, tmp_path, capsys):
    cut = _cut(live["live.jsonl"], tmp_path, lambda n: 40)
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(cut)])
    assert exc.value.code == 2
    assert f"minivllm: error: {cut}: the log was cut off inside its first line" in capsys.readouterr().err
