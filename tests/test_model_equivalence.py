"""Token-for-token equality with HF transformers greedy decoding (fp32, CPU) on tiny random-weight
Llama, Qwen2 and Qwen3 models: one request, a mixed batch, chunked prefill on and off, prefix-cache
hits, and preemption with recompute."""

from __future__ import annotations

import random

import pytest

from tests.model_helpers import hf_greedy, make_tiny, one_thread, run_engine

ARCHS = ["llama", "qwen2", "qwen3"]
pytestmark = pytest.mark.usefixtures(one_thread.__name__)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    return make_tiny(request.param, tmp_path_factory.mktemp(request.param))


def _prompts(seed: int, lengths: list[int], vocab: int = 320) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def _check(tiny, prompts, max_tokens, run):
    for prompt, n, out in zip(prompts, max_tokens, run.outputs):
        assert out == tiny.reference(prompt, n), f"{tiny.arch}: prompt of {len(prompt)} tokens diverged"


def test_single_request(tiny):
    prompts = _prompts(0, [11])
    _check(tiny, prompts, [20], run_engine(tiny.loaded, prompts, 20))


def test_mixed_batch(tiny):
    prompts = _prompts(1, [1, 5, 16, 17, 40, 3, 64])
    max_tokens = [12, 20, 7, 16, 10, 25, 9]
    run = run_engine(tiny.loaded, prompts, max_tokens)
    _check(tiny, prompts, max_tokens, run)


@pytest.mark.parametrize("chunked", [True, False])
def test_chunked_prefill_on_off(tiny, chunked):
    prompts = _prompts(2, [50, 33, 7, 70])
    max_tokens = [10, 14, 18, 6]
    run = run_engine(tiny.loaded, prompts, max_tokens, max_num_batched_tokens=24 if chunked else 96,
                     enable_chunked_prefill=chunked)
    if chunked:
        assert run.chunked_spans > 0, "the budget should have split prompts into chunks"
    else:
        assert run.chunked_spans == 0
    _check(tiny, prompts, max_tokens, run)


def test_prefix_cache_hits(tiny):
    shared = _prompts(3, [26])[0]
    tails = _prompts(4, [3, 9, 1, 14])
    prompts = [shared + t for t in tails] + [shared]  # the last one: hit on all but its final block
    max_tokens = [12, 8, 15, 10, 9]
    run = run_engine(tiny.loaded, prompts, max_tokens, staggered=True)
    assert run.cached_tokens >= 4 * 24, "later prompts should reuse the shared prefix's blocks"
    _check(tiny, prompts, max_tokens, run)


def test_preemption_and_recompute(tiny):
    prompts = _prompts(5, [20, 18, 25, 12, 30])
    max_tokens = [30, 28, 24, 30, 20]
    run = run_engine(tiny.loaded, prompts, max_tokens, block_size=4, num_blocks=36)
    assert run.preemptions > 0, "a tiny pool should force preemption"
    _check(tiny, prompts, max_tokens, run)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_cpu_runs_close_to_hf(tmp_path, dtype):
    """fp16/bf16 run on the CPU too; rounding differs from HF's, so only the first tokens must agree."""
    import torch

    from runtime.executor.model.loader import load_model

    tiny = make_tiny("qwen3", tmp_path)
    hf = tiny.hf.to(getattr(torch, dtype))
    loaded = load_model(str(tmp_path), device="cpu", dtype=dtype)
    assert loaded.model.embed_tokens.weight.dtype == getattr(torch, dtype)
    prompts = _prompts(6, [5, 20, 9])
    run = run_engine(loaded, prompts, 8)
    for p, out in zip(prompts, run.outputs):
        assert out[:2] == hf_greedy(hf, p, 8)[:2]
