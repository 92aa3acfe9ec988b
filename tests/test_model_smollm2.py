"""The real default model (SmolLM2-135M-Instruct, fp32, CPU): greedy tokens equal HF transformers'
token for token, and the default model is found without a path. The GGUF is converted once
(~30 s) into the cache; later runs load in a few seconds."""

from __future__ import annotations

import pytest
import torch

from runtime.executor.model.loader import load_model
from tests.model_helpers import hf_greedy, one_thread, run_engine, smollm2_folder

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures(one_thread.__name__)]

TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
         "List three colors:\n1."]


@pytest.fixture(scope="module")
def smol():
    loaded = load_model(None, device="cpu", dtype="float32")
    assert loaded.identity.startswith("SmolLM2-135M-Instruct.Q4_1.gguf@")
    return loaded


def test_greedy_matches_hf(smol):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smollm2_folder(), dtype=torch.float32).eval()
    prompts = [smol.tokenizer(t)["input_ids"] for t in TEXTS]
    max_tokens = [24, 24, 20, 16]
    run = run_engine(smol, prompts, max_tokens, block_size=16, num_blocks=64, max_num_batched_tokens=24)
    assert run.chunked_spans > 0  # the longer prompts were chunked
    for prompt, n, out in zip(prompts, max_tokens, run.outputs):
        assert out == hf_greedy(hf, prompt, n), smol.tokenizer.decode(out)
