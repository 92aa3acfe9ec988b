"""runtime/executor/sampling.py on the CPU: each option, logprobs, seeds, batch independence, edge cases."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from runtime.executor.sampling import Sampler, SamplingBatch, plain_greedy, request_rng
from tests.sampling_reference import draws, penalised, reference_draw, reference_probs, sample
from traces.params import SamplingParams as SP

V = 64


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(8, V, generator=torch.Generator().manual_seed(0)) * 3


class FixedRng(random.Random):
    """A stream that always returns the same uniform (to hit the inverse-CDF edges)."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


def test_greedy_is_argmax_and_draws_nothing(logits):
    rngs = [random.Random(i) for i in range(8)]
    states = [r.getstate() for r in rngs]
    out = sample(logits, [SP(temperature=0)] * 8, rngs)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs is None
    assert [r.getstate() for r in rngs] == states
    assert sample(logits.bfloat16(), [SP(temperature=0)] * 8, [None] * 8).token_ids == \
        logits.bfloat16().argmax(-1).tolist()
    greedy = [SP(temperature=0, max_tokens=i + 1) for i in range(8)]
    assert plain_greedy(greedy)
    assert Sampler().sample(logits, SamplingBatch.greedy(8, "cpu")).token_ids == out.token_ids
    assert not plain_greedy(greedy + [SP(temperature=0, logprobs=1)])
    assert not plain_greedy(greedy + [SP(temperature=0, presence_penalty=0.5)])
    assert not plain_greedy(greedy + [SP(temperature=0.5)])


def test_draws_match_float64_reference(logits):
    """Token-for-token against the reference inverse CDF for a mix of every option."""
    params = [SP(), SP(temperature=0.7), SP(top_k=5), SP(top_p=0.8), SP(min_p=0.05),
              SP(temperature=1.3, top_k=10, top_p=0.9, min_p=0.02), SP(top_k=1), SP(top_p=0.5, top_k=3)]
    for step in range(40):
        rngs = [request_rng(7, step * 8 + i, None) for i in range(8)]
        us = [request_rng(7, step * 8 + i, None).random() for i in range(8)]
        got = sample(logits, params, rngs).token_ids
        want = [reference_draw(reference_probs(logits[i].numpy(), p), u)
                for i, (p, u) in enumerate(zip(params, us))]
        assert got == want


@pytest.mark.parametrize("p,allowed", [
    (SP(top_k=1), 1), (SP(top_k=3), 3), (SP(top_p=1e-9), 1), (SP(min_p=1.0), 1), (SP(top_k=1000), V),
])
def test_filters_restrict_support(logits, p, allowed):
    got = set(draws(logits[0], p, 3000).tolist())
    order = logits[0].argsort(descending=True).tolist()
    assert got <= set(order[:allowed])
    assert got == set(order[:allowed]) if allowed <= 3 else len(got) > 10


def test_min_p_threshold_is_relative_to_best(logits):
    row = logits[1]
    probs = torch.softmax(row.double(), -1)
    got = set(draws(row, SP(min_p=0.2), 3000).tolist())
    allowed = set(torch.nonzero(probs >= 0.2 * probs.max()).flatten().tolist())
    assert got == allowed


def test_temperature_changes_spread(logits):
    row = logits[2]
    best = int(row.argmax())
    cold = (draws(row, SP(temperature=0.2), 2000) == best).mean()
    warm = (draws(row, SP(temperature=1.0), 2000) == best).mean()
    hot = (draws(row, SP(temperature=5.0), 2000) == best).mean()
    assert cold > warm > hot


def test_repetition_penalty_over_prompt_and_output(logits):
    row = logits[3:4]
    best = int(row.argmax())
    # the best token seen only in the prompt is penalised too (repetition covers prompt + output)
    hist = ([best, 1, 2], 3)
    greedy = sample(row, [SP(temperature=0, repetition_penalty=100.0)], [None], [hist]).token_ids[0]
    assert greedy != best
    # presence / frequency only look at the output: a prompt-only token is untouched
    same = sample(row, [SP(temperature=0, presence_penalty=2.0, frequency_penalty=2.0)], [None],
                  [hist]).token_ids[0]
    assert same == best


def test_penalty_arithmetic_matches_reference(logits):
    """processed logprobs expose the penalised logits: compare with the reference arithmetic."""
    v = 16
    params = [SP(temperature=0, repetition_penalty=1.7, logprobs=v),
              SP(presence_penalty=1.5, frequency_penalty=-0.5, temperature=0.5, logprobs=v),
              SP(repetition_penalty=0.6, presence_penalty=-1.0, frequency_penalty=0.75, logprobs=v)]
    hists = [([3, 4, 5, 3, 9], 2), ([1, 2, 2, 2, 7], 1), ([0, 5, 5, 6, 15, 6, 6], 3)]
    rows = logits[:3, :v]
    out = sample(rows, params, [random.Random(i) for i in range(3)], hists, Sampler("processed"))
    for i, (p, h) in enumerate(zip(params, hists)):
        x = penalised(rows[i].numpy(), p, h) / (p.temperature or 1.0)
        want = x - x.max() - np.log(np.exp(x - x.max()).sum())
        got = np.array([out.logprobs[i][t] for t in range(v)])
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_penalty_needs_history(logits):
    with pytest.raises(ValueError, match="history"):
        SamplingBatch.build([SP(presence_penalty=1.0)], [random.Random(0)], None)


def test_raw_logprobs(logits):
    params = [SP(temperature=0, logprobs=3), SP(), SP(logprobs=0), SP(logprobs=20, repetition_penalty=2.0)]
    hists = [None, None, None, ([1, 2, 3], 1)]
    out = sample(logits[:4], params, [random.Random(i) for i in range(4)], hists)
    ref = torch.log_softmax(logits[:4].double(), -1)
    assert out.logprobs[1] is None
    for i in (0, 2, 3):
        d = out.logprobs[i]
        tok = out.token_ids[i]
        assert next(iter(d)) == tok  # sampled token first
        n = params[i].logprobs
        top = ref[i].topk(n).indices.tolist() if n else []
        assert list(d)[1:] == [t for t in top if t != tok]
        for t, lp in d.items():
            assert lp == pytest.approx(float(ref[i, t]), abs=1e-5)
    small = sample(logits[:1, :5], [SP(logprobs=20)], [random.Random(0)])
    assert len(small.logprobs[0]) == 5


def test_seeded_reproducibility(logits):
    def run(seed, request_id, engine_seed=0):
        rng = request_rng(engine_seed, request_id, seed)
        return [sample(logits[s % 8:s % 8 + 1], [SP()], [rng]).token_ids[0] for s in range(30)]

    assert run(42, 0) == run(42, 5) == run(42, 0, engine_seed=9)  # a user seed ignores ids
    assert run(42, 0) != run(43, 0)
    assert run(None, 3) == run(None, 3)
    assert run(None, 3) != run(None, 4)
    assert run(None, 3) != run(None, 3, engine_seed=1)
    # the n > 1 sequences of one request get distinct streams, seeded or not
    first = [request_rng(0, 0, s, i).random() for s in (42, None) for i in range(3)]
    assert len(set(first)) == 6
    assert request_rng(0, 0, 42, 1).random() == request_rng(5, 9, 42, 1).random()


def test_batch_composition_independence():
    """A request's tokens are the same alone or in batches of other requests with other params."""
    gen = torch.Generator().manual_seed(1)
    steps, vocab = 25, 200
    mine = SP(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, repetition_penalty=1.2,
              frequency_penalty=0.3, logprobs=2)
    my_logits = torch.randn(steps, vocab, generator=gen) * 4
    others = [SP(), SP(temperature=0), SP(top_p=0.3), SP(top_k=2, logprobs=5), SP(min_p=0.5),
              SP(presence_penalty=1.0, temperature=0.4)]

    def run(batch_sizes: list[int], position_seed: int) -> list[int]:
        rng = request_rng(0, 0, 1234)
        pos_rng = random.Random(position_seed)
        prompt, out = [5, 6, 7], []
        for s in range(steps):
            b = batch_sizes[s % len(batch_sizes)]
            at = pos_rng.randrange(b)
            rows = torch.randn(b, vocab, generator=gen) * 4
            rows[at] = my_logits[s]
            params = [others[pos_rng.randrange(len(others))] for _ in range(b)]
            params[at] = mine
            rngs = [random.Random(pos_rng.random()) for _ in range(b)]
            rngs[at] = rng
            hists = [([1, 2, 3, 4], 2)] * b
            hists[at] = (prompt + out, len(prompt))
            res = sample(rows, params, rngs, hists)
            out.append(res.token_ids[at])
            assert next(iter(res.logprobs[at])) == out[-1]
        return out

    alone = run([1], 0)
    assert run([7, 2, 16], 1) == alone
    assert run([3, 33], 2) == alone
    assert len(set(alone)) > 3


def test_mixed_greedy_and_sampled_rows(logits):
    params = [SP(temperature=0), SP(), SP(temperature=0, top_k=3), SP(top_p=0.5)] * 2
    rngs = [None if p.temperature == 0 else random.Random(i) for i, p in enumerate(params)]
    out = sample(logits, params, rngs).token_ids
    for i, p in enumerate(params):
        if p.temperature == 0:
            assert out[i] == int(logits[i].argmax())


def test_inverse_cdf_edges():
    row = torch.tensor([[0.0, -float("inf"), 1.0, 2.0, -float("inf")]])
    # u just below 1 lands on the last kept token, never on a filtered (-inf) one
    assert sample(row, [SP()], [FixedRng(1 - 2**-53)]).token_ids == [3]
    assert sample(row, [SP(top_k=2)], [FixedRng(1 - 2**-53)]).token_ids == [3]
    assert sample(row, [SP(top_k=2)], [FixedRng(0.0)]).token_ids == [2]
    assert sample(row, [SP()], [FixedRng(0.0)]).token_ids == [0]
    # temperature tiny but above the greedy cut-off, still finite
    assert sample(row, [SP(temperature=2e-5)], [FixedRng(0.5)]).token_ids == [3]
    huge = torch.full((1, 1000), 0.0)
    huge[0, 999] = 1e-3
    assert sample(huge, [SP(top_p=1e-6)], [FixedRng(0.9)]).token_ids == [999]


def test_empty_and_shape_errors():
    assert sample(torch.zeros(0, 10), [], []).token_ids == []
    batch = SamplingBatch.build([SP()], [random.Random(0)])
    with pytest.raises(ValueError, match="rows"):
        Sampler().sample(torch.zeros(2, 10), batch)
    with pytest.raises(ValueError, match="rngs"):
        SamplingBatch.build([SP()], [])
    with pytest.raises(ValueError, match="row 1 samples"):
        SamplingBatch.build([SP(temperature=0), SP()], [None, None])


def test_half_precision_logits_sample_like_their_float32_values(logits):
    params = [SP(), SP(top_p=0.8, top_k=9), SP(temperature=0), SP(min_p=0.1, presence_penalty=1.0)] * 2
    hists = [([1, 2], 1)] * 8
    for dtype in (torch.bfloat16, torch.float16):
        low = logits.to(dtype)
        rngs_a = [request_rng(3, i, None) for i in range(8)]
        rngs_b = [request_rng(3, i, None) for i in range(8)]
        assert sample(low, params, rngs_a, hists).token_ids == \
            sample(low.float(), params, rngs_b, hists).token_ids
