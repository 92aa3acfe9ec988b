"""``minivllm generate``: completions on stdout, the event log, and flag errors that name the flag."""

from __future__ import annotations

import json

import pytest

from runtime.cli import main
from tests.model_helpers import make_tiny, one_thread
from traces.events import Header
from traces.log import read_log

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("cli"), tokenizer=True)


def _base(tiny):
    return ["generate", "--model", str(tiny.folder), "--device", "cpu", "--block-size", "4", "--num-blocks", "64",
            "--max-model-len", "128", "--no-progress"]


def test_generate_prints_and_traces(tiny, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    rc = main(_base(tiny) + ["Hello world", "the fox", "--max-tokens", "6", "--ignore-eos", "--json",
                             "--trace", str(trace)])
    assert rc == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(f"loading model {tiny.folder} …")  # the silent stage, announced
    lines = [json.loads(x) for x in captured.out.splitlines()]
    assert [x["prompt"] for x in lines] == ["Hello world", "the fox"]
    ids = tiny.loaded.tokenizer("Hello world")["input_ids"] if tiny.loaded.tokenizer else None
    assert lines[0]["token_ids"] == tiny.reference(ids, 6)
    assert all(x["finish_reason"] == "length" for x in lines)
    assert isinstance(next(iter(read_log(trace))), Header)


def test_prompts_file_and_chat(tiny, tmp_path, capsys):
    f = tmp_path / "prompts.txt"
    f.write_text("Hello\n\nthe dog\n")
    assert main(_base(tiny) + ["--prompts-file", str(f), "--chat", "--max-tokens", "3", "--ignore-eos"]) == 0
    assert capsys.readouterr().out.count("--- ") == 2


@pytest.mark.parametrize("flags,named", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--block-size", "3"], "--block-size"),
    (["--prompts-file", "/nonexistent/p.txt"], "--prompts-file"),
])
def test_bad_flags_name_the_flag(tiny, capsys, flags, named):
    with pytest.raises(SystemExit) as exc:
        main(_base(tiny) + ["x"] + flags)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_bad_model_path(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "x", "--model", "/no/such/model", "--device", "cpu"])
    assert "/no/such/model" in capsys.readouterr().err


def test_trace_if_exists(tiny, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    argv = _base(tiny) + ["hi", "--max-tokens", "2", "--trace", str(trace)]
    assert main(argv) == 0
    first = trace.read_bytes()
    assert main(argv) == 0  # default: rotate, the older log kept under the next number
    assert (tmp_path / "run.1.jsonl").read_bytes() == first
    assert f"moved the log already at {trace} to {tmp_path / 'run.1.jsonl'}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--trace-if-exists", "error"])
    assert exc.value.code == 2
    assert f"--trace: {trace}: a log is already there" in capsys.readouterr().err
    assert main(argv + ["--trace-if-exists", "overwrite"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.1.jsonl", "run.jsonl"]
    assert isinstance(next(iter(read_log(trace))), Header)
