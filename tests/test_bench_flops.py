"""A step's FLOP count from its spans and the model's dimensions, against a hand count; the
measured matmul peak is a positive FLOP/s."""

from __future__ import annotations

import torch

from runtime.bench.flops import FlopCounter, step_flops
from runtime.bench.gemm_peak import measure_gemm_peak
from runtime.executor.model.spec import ModelSpec
from traces.events import Span

# hidden 8, 2 layers, 2 heads of 4 (q 8), 1 KV head (kv 4), MLP 16, vocab 10
SPEC = ModelSpec("llama", hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                 intermediate_size=16, vocab_size=10, rms_norm_eps=1e-6, max_position_embeddings=64,
                 tie_word_embeddings=True)


def test_step_flops_by_hand():
    # per layer per token: QKV 8*(8+4+4)=128, O 8*8=64, MLP 3*8*16=384 -> 576; 2 layers -> 1152 params
    # prefill 3 tokens at 0..2 (context 1+2+3=6), sampled; decode 1 token at 5 (context 6), sampled;
    # a chunk of 2 at 4..5 (context 5+6=11), not sampled
    spans = [Span(0, 0, 3, True), Span(1, 5, 1, True), Span(2, 4, 2, False)]
    linear = 2 * 1152 * (3 + 1 + 2)
    head = 2 * 8 * 10 * 2
    attention = 4 * (6 + 6 + 11) * 4 * 2 * 2
    assert step_flops(SPEC, spans) == linear + head + attention == 13824 + 320 + 1472


def test_counter_keeps_prefill_bearing_steps_only():
    counter = FlopCounter.of(SPEC)
    counter.add_step([Span(0, 7, 1, True)], 1.0)  # decode only: left out
    counter.add_step([Span(0, 0, 3, True), Span(1, 5, 1, True)], 0.5)
    assert (counter.steps, counter.seconds) == (1, 0.5)
    assert counter.flops == step_flops(SPEC, [Span(0, 0, 3, True), Span(1, 5, 1, True)])


def test_gemm_peak_is_measured():
    assert measure_gemm_peak(torch.device("cpu"), torch.float32, repeats=1) > 0
