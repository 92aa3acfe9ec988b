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


def test_sampled_beside_greedy(tiny, tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["bench", "throughput", "--model", str(tiny.folder), "--device", "cpu", "--num-prompts", "4",
               "--input-len", "4", "12", "--output-len", "3", "6", "--peer", "none", "--block-size", "4",
               "--num-blocks", "64", "--no-progress", "--temperature", "0.8", "--top-p", "0.95", "--top-k", "50",
               "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())["results"][0]
    requested = sum(Workload.random(4, (4, 12), (3, 6), 320, 0).outputs)
    assert doc["engine"]["output_tokens"] == doc["sampled"]["output_tokens"] == requested
    assert doc["setup"]["sampling"] == {"temperature": 0.8, "top_p": 0.95, "top_k": 50}
    assert doc["sampled_vs_greedy"] == doc["sampled"]["output_tok_s"] / doc["engine"]["output_tok_s"]
    assert "minivllm sampled" in text and "of greedy's tok/s" in text


def test_bad_sampling_flags_name_the_flag(tiny, capsys):
    for flags, named in ((["--top-p", "0"], "--top-p"), (["--temperature", "0"], "--temperature"),
                         (["--top-k", "-3"], "--top-k")):
        with pytest.raises(SystemExit):
            main(["bench", "throughput", "--model", str(tiny.folder), "--peer", "none", *flags])
        assert named in capsys.readouterr().err


def test_prefill_flops_against_the_measured_peak(tiny, tmp_path, capsys):
    """One output token each: every step is a prefill, so the count is the prompts' own, whatever
    the chunking."""
    from runtime.bench.flops import FlopCounter

    out = tmp_path / "f.json"
    rc = main(["bench", "throughput", "--model", str(tiny.folder), "--device", "cpu", "--num-prompts", "5",
               "--input-len", "4", "20", "--output-len", "1", "1", "--peer", "none", "--block-size", "4",
               "--num-blocks", "64", "--no-progress", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())["results"][0]["prefill_compute"]
    per = FlopCounter.of(tiny.loaded.spec)
    lengths = [len(p) for p in Workload.random(5, (4, 20), (1, 1), 320, 0).prompts]
    expected = sum(n * per.per_token + per.per_sample + n * (n + 1) // 2 * per.per_context for n in lengths)
    assert doc["flops"] == expected
    assert doc["peak_tflops"] > 0 and doc["fraction"] > 0
    assert "prefill compute:" in text and "measured dense matmul peak" in text
