"""PiecewiseGraphs off CUDA (a dry run: the same static buffers, padding and attention splits,
run eagerly): greedy tokens equal HF for mixed, chunked and overlapped steps."""

from __future__ import annotations

import random

import pytest

from tests.model_helpers import make_tiny, one_thread, run_engine

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request, tmp_path_factory):
    return make_tiny(request.param, tmp_path_factory.mktemp(f"pw-{request.param}"))


@pytest.mark.parametrize("budget", [24, 2048])
@pytest.mark.parametrize("overlap", [False, True])
def test_piecewise_dry_run_equals_hf(tiny, budget, overlap):
    rng = random.Random(budget)
    lengths, max_tokens = [1, 40, 17, 9, 70], [9, 6, 12, 8, 5]
    prompts = [[rng.randrange(320) for _ in range(n)] for n in lengths]
    run = run_engine(tiny.loaded, prompts, max_tokens, piecewise=True, overlap=overlap,
                     max_num_batched_tokens=budget, max_num_seqs=4)
    assert run.runner.piecewise.replays > 0
    for p, n, out in zip(prompts, max_tokens, run.outputs):
        assert out == tiny.reference(p, n)


def test_burst_idle_burst_pads_with_real_ids(tiny):
    """A burst whose mixed steps feed many decode inputs as placeholders, an idle engine, then one
    short prompt: the short step's padding must not reuse the burst's placeholder ids (on the GPU an
    out-of-vocabulary id in the embedding is a device-side assert that kills the server)."""
    rng = random.Random(7)
    burst = [[rng.randrange(320) for _ in range(3)] for _ in range(8)] + [[rng.randrange(320) for _ in range(90)]]
    late = [[rng.randrange(320) for _ in range(2)]]
    max_tokens = [20] * 8 + [3] + [4]
    run = run_engine(tiny.loaded, burst + late, max_tokens, piecewise=True, overlap=True, waves=[len(burst), 1],
                     max_num_batched_tokens=24, max_num_seqs=16)
    for p, n, out in zip(burst + late, max_tokens, run.outputs):
        assert out == tiny.reference(p, n)
