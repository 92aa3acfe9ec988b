"""``minivllm log redact``: an ids log rewritten without its token ids; every other event kept, and
a hashes log still shows a re-simulation the same prefix-cache hits."""

from __future__ import annotations

import pytest

from runtime.cli import main
from tests.helpers import SeededTokenExecutor
from tests.sim_helpers import record_live, small_config
from traces.events import Admitted, Arrived, Header, recorded_prompts
from traces.formats import load_workload
from traces.log import LogWriter, read_log
from traces.params import SamplingParams
from traces.prompt import PromptIds, PromptSynthetic
from traces.workload import RequestSpec, Workload


def _shared_prefix_log(path):
    doc = list(range(100, 164))  # 64 tokens: full blocks shared by every other request
    specs = [RequestSpec(arrival=0.01 * i, prompt=PromptIds(doc + [7, i] if i % 2 else [5, 6, i]),
                         params=SamplingParams(max_tokens=4, ignore_eos=True)) for i in range(8)]
    config = small_config(prefix=True)
    events = record_live(Workload(specs, source="test"), config, SeededTokenExecutor(seed=1))
    with LogWriter(path) as out:
        for e in events:
            out(e)
    return config


def _cached(events) -> list[int]:
    return [e.num_cached_tokens for e in events if isinstance(e, Admitted)]


@pytest.mark.parametrize("mode", ["hashes", "none"])
def test_redacted_log_keeps_every_event_but_the_token_ids(tmp_path, mode, capsys):
    src, dst = tmp_path / "ids.jsonl", tmp_path / f"{mode}.jsonl.gz"
    _shared_prefix_log(src)
    assert main(["log", "redact", str(src), str(dst), "--prompts", mode]) == 0
    assert "8 prompts kept as" in capsys.readouterr().out
    old, new = list(read_log(src)), list(read_log(dst))
    assert isinstance(new[0], Header) and recorded_prompts(new[0]) == mode
    assert len(old) == len(new)
    for a, b in zip(old[1:], new[1:]):
        if isinstance(a, Arrived):
            assert isinstance(b.prompt, PromptSynthetic) and b.prompt.num_tokens == len(a.prompt.token_ids)
            assert (b.prompt.segment_ids != []) == (mode == "hashes" and len(a.prompt.token_ids) >= 16)
            assert (b.time, b.request_id, b.params) == (a.time, a.request_id, a.params)
        else:
            assert a == b


def test_hashes_keep_the_prefix_hits_a_resimulation_sees(tmp_path):
    src, dst = tmp_path / "ids.jsonl", tmp_path / "hashes.jsonl"
    config = _shared_prefix_log(src)
    assert main(["log", "redact", str(src), str(dst)]) == 0
    live = _cached(read_log(src))
    assert sum(live) > 0  # the shared document was served from the prefix cache
    again = record_live(load_workload(dst), config, SeededTokenExecutor(seed=1))
    assert _cached(again) == live


def test_refuses_a_log_without_ids_and_an_existing_target(tmp_path, capsys):
    src, dst = tmp_path / "ids.jsonl", tmp_path / "h.jsonl"
    _shared_prefix_log(src)
    assert main(["log", "redact", str(src), str(dst)]) == 0
    capsys.readouterr()
    for argv, message in [((dst, tmp_path / "again.jsonl"), "only a log of token ids can be redacted"),
                          ((src, dst), "--force")]:
        with pytest.raises(SystemExit) as exc:
            main(["log", "redact", *map(str, argv)])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
