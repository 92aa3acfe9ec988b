"""``minivllm serve``: every flag's help shows its default; the server flags reach the app and the
engine (--api-key, --max-request-bytes, --trace-prompts, --trace-if-exists), on a tiny real model."""

from __future__ import annotations

import argparse

import httpx
import openai
import pytest

from runtime.cli import build_parser
from runtime.cli.errors import CLIError
from runtime.cli.serve import build_app
from runtime.serving.server.launch import ServerThread
from tests.model_helpers import make_tiny, one_thread
from traces.events import Arrived, Header, recorded_prompts
from traces.log import read_log
from traces.prompt import PromptIds, PromptSynthetic

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def _serve_parser() -> argparse.ArgumentParser:
    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def _shown(default) -> str | None:
    """How the help spells a default; None where there is none to show."""
    if default is None or default is False:
        return None
    return str(default)


def test_every_serve_flag_has_help_showing_its_default():
    parser = _serve_parser()
    formatter = parser._get_formatter()
    ours = {a for g in parser._action_groups if g.title in ("server", "event log") for a in g._group_actions}
    checked = set()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        label = max(action.option_strings, key=len) if action.option_strings else action.metavar
        text = " ".join(formatter._expand_help(action).split())
        shown = _shown(action.default)
        if shown is not None:
            assert "default" in text and shown in text, (label, text)
        elif action in ours:  # the server's flags say what "not given" means too
            assert "default" in text, (label, text)
        checked.add(label)
    assert {"--host", "--port", "--api-key", "--max-pending", "--max-request-bytes", "--trace", "--trace-prompts",
            "--trace-if-exists", "--served-model-name", "--max-model-len"} <= checked


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("serve_cli"), tokenizer=True)


def _args(tiny, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--model", str(tiny.folder), "--device", "cpu", "--block-size", "4",
                                      "--num-blocks", "64", "--max-model-len", "128", *flags])


def _run(args: argparse.Namespace, *prompts: str, key: str | None = None) -> None:
    app, engine, close = build_app(args)
    try:
        with ServerThread(app) as http:
            client = openai.OpenAI(base_url=http.url + "/v1", api_key=key or "none", max_retries=0)
            for prompt in prompts:
                client.completions.create(model=app.state.server.model_name, prompt=prompt, max_tokens=2,
                                          extra_body={"cache_salt": "tenant"})
            if key:
                assert httpx.get(http.url + "/v1/models").status_code == 401
            auth = {"authorization": f"Bearer {key}"} if key else {}
            assert httpx.post(http.url + "/v1/completions", content=b"x" * 2048,
                              headers={"content-type": "application/json", **auth}).status_code == 413
    finally:
        close()


def test_serve_flags_reach_the_engine_and_its_log(tiny, tmp_path):
    log = tmp_path / "live.jsonl"
    prompt = "hello there, a prompt long enough to fill two blocks of four tokens"
    _run(_args(tiny, "--trace", str(log), "--trace-prompts", "hashes", "--api-key", "k1",
               "--max-request-bytes", "1024"), prompt, key="k1")
    events = list(read_log(log))
    header = events[0]
    assert isinstance(header, Header) and header.extra["trace_prompts"] == "hashes"
    assert recorded_prompts(header) == "hashes"
    arrived = [e for e in events if isinstance(e, Arrived)]
    assert len(arrived) == 1 and isinstance(arrived[0].prompt, PromptSynthetic)  # no token ids kept
    assert arrived[0].prompt.segment_ids and arrived[0].cache_salt == "tenant"
    assert b"hello" not in log.read_bytes()

    # the default --trace-if-exists rotate keeps the first log, under its next numbered name
    _run(_args(tiny, "--trace", str(log), "--max-request-bytes", "1024"), "second run")
    rotated = tmp_path / "live.1.jsonl"
    assert rotated.exists() and isinstance(list(read_log(rotated))[0], Header)
    new = list(read_log(log))
    assert "trace_prompts" not in new[0].extra  # ids, the default: the Header is what it always was
    assert isinstance(next(e for e in new if isinstance(e, Arrived)).prompt, PromptIds)

    with pytest.raises(CLIError, match="--trace-if-exists"):
        build_app(_args(tiny, "--trace", str(log), "--trace-if-exists", "error"))
    assert len(list(read_log(log))) == len(new)  # left as it was

    _run(_args(tiny, "--trace", str(log), "--trace-if-exists", "overwrite", "--max-request-bytes", "1024"), "third")
    assert not (tmp_path / "live.2.jsonl").exists()


def test_bad_server_flags_name_the_flag(tiny):
    for flags, named in ((("--max-pending", "0"), "--max-pending"), (("--max-request-bytes", "0"),
                                                                     "--max-request-bytes")):
        with pytest.raises(CLIError, match=named):
            build_app(_args(tiny, *flags))
    with pytest.raises(SystemExit):
        _args(tiny, "--trace-prompts", "text")
