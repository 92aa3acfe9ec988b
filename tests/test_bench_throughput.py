"""``minivllm bench throughput`` end to end on a tiny model: every peer runs on the same workload
and is credited with exactly the requested tokens; the report and the JSON have the figures."""

from __future__ import annotations

import json

import pytest

from runtime.bench.throughput import Workload
from runtime.cli import main
from tests.model_helpers import make_tiny, one_thread

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("bench"))


def test_workload_is_seeded():
    a = Workload.random(5, (3, 9), (2, 4), 100, seed=1)
    b = Workload.random(5, (3, 9), (2, 4), 100, seed=1)
    assert a == b and all(3 <= len(p) <= 9 for p in a.prompts) and all(2 <= n <= 4 for n in a.outputs)


def _run(tiny, tmp_path, peers, capsys):
    out = tmp_path / "b.json"
    rc = main(["bench", "throughput", "--model", str(tiny.folder), "--device", "cpu", "--num-prompts", "6",
               "--input-len", "4", "20", "--output-len", "2", "9", "--hf-peers", peers, "--static-batch", "4",
               "--block-size", "4", "--num-blocks", "128", "--no-progress", "--json", str(out)])
    assert rc == 0
    return capsys.readouterr().out, json.loads(out.read_text())["results"][0]


def test_engine_and_hf_peers(tiny, tmp_path, capsys):
    text, doc = _run(tiny, tmp_path, "single,static", capsys)
    requested = sum(Workload.random(6, (4, 20), (2, 9), 320, 0).outputs)
    assert doc["engine"]["output_tokens"] == requested
    assert [p["output_tokens"] for p in doc["peers"]] == [requested, requested]
    assert doc["speedup_vs_best_hf"] > 0
    assert "minivllm" in text and "static batches of 4" in text and "engine overhead" in text


@pytest.mark.slow
def test_continuous_batching_peer(tiny, tmp_path, capsys):
    _, doc = _run(tiny, tmp_path, "cb", capsys)
    assert doc["peers"][0]["name"].startswith("hf continuous batching")


def test_bad_flags(tiny, capsys):
    for flags, named in ((["--hf-peers", "vllm"], "--hf-peers"), (["--input-len", "9", "3"], "--input-len"),
                         (["--model-shape", "smollm2-135m"], "--model-shape")):
        with pytest.raises(SystemExit):
            main(["bench", "throughput", "--model", str(tiny.folder), *flags])
        assert named in capsys.readouterr().err
