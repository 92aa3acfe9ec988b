"""``minivllm serve``'s checks before the model loads: the model as MODEL or --model (not both), a
port in range, a port nobody else listens on. Each bad one is one line naming the flag, exit 2, and
the model loader is never reached (nor is the event log opened)."""

from __future__ import annotations

import signal
import socket

import pytest

from runtime.cli import main, serve
from runtime.cli.errors import CLIError


def _fails(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture
def no_load(monkeypatch):
    """``build_app`` (where the model loads) records the model it was asked for and stops there."""
    asked = []

    def build_app(args, on_dead=None):
        asked.append(args.model)
        raise CLIError("stopped before loading")

    monkeypatch.setattr(serve, "build_app", build_app)
    handler = signal.getsignal(signal.SIGTERM)  # serve installs its own before loading
    yield asked
    signal.signal(signal.SIGTERM, handler)


def test_a_port_in_use_is_refused_before_the_model_loads(no_load, tmp_path, capsys):
    log = tmp_path / "live.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _fails(["serve", "--port", str(port), "--trace", str(log)], capsys)
    assert err == f"minivllm: error: --port: 127.0.0.1:{port} is already in use (choose another --port)"
    assert no_load == [] and not log.exists()


@pytest.mark.parametrize(("port", "rule"), [("99999", "must be < 65536, got 99999"), ("-1", "must be >= 0, got -1")])
def test_a_port_out_of_range_names_the_flag(port, rule, no_load, capsys):
    assert _fails(["serve", "--port", port], capsys) == f"minivllm: error: --port: {rule}"
    assert no_load == []


def test_a_host_that_is_not_this_machines_names_the_flag(no_load, capsys):
    err = _fails(["serve", "--host", "192.0.2.1", "--port", "0"], capsys)  # TEST-NET-1: never local
    assert err.startswith("minivllm: error: --host: cannot listen on 192.0.2.1:0 (") and no_load == []


def test_the_model_is_a_positional_or_a_flag_but_not_both(no_load, capsys):
    err = _fails(["serve", "random:a", "--model", "random:b"], capsys)
    assert err == ("minivllm: error: --model: the model is given twice, as MODEL (random:a) and as --model "
                   "(random:b); give one")
    assert no_load == []
    for argv in (["serve", "random:a", "--port", "0"], ["serve", "--port", "0", "--model", "random:a"],
                 ["serve", "--port", "0", "random:a", "--device", "cpu"]):
        assert _fails(argv, capsys) == "minivllm: error: stopped before loading"
    _fails(["serve", "--port", "0"], capsys)
    assert no_load == ["random:a"] * 3 + [None]


@pytest.mark.parametrize(("flags", "why"), [
    (["--no-engine-process"], "--no-engine-process"), (["--data-parallel-size", "2"], "--data-parallel-size")])
def test_more_front_ends_need_one_engine_process(flags, why, capsys):
    from runtime.cli import build_parser

    args = build_parser().parse_args(["serve", "--api-server-count", "2", *flags])
    with pytest.raises(CLIError, match=f"--api-server-count: more front ends share one engine process "
                                       f"\\(drop {why}\\)"):
        serve.build_app(args)
    assert "loading" not in capsys.readouterr().err  # refused before the model loads


def test_a_front_end_count_below_one_names_the_flag(no_load, capsys):
    err = _fails(["serve", "--api-server-count", "0"], capsys)
    assert err == "minivllm: error: --api-server-count: must be >= 1, got 0"
