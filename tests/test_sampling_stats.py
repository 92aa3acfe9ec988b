"""The distribution of draws matches the reference probabilities: chi-square over many seeded
draws, and a grid of N uniforms landing on each token in proportion to its probability, to within
1/N (the inverse CDF's quadrature; the Triton kernel's twin is in sampling_interpret_checks.py,
and its GPU run in test_sampling_gpu.py)."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import pytest
import torch

from runtime.executor.sampling import Sampler, SamplingBatch
from tests.sampling_reference import chi_square_ok, draws, reference_probs
from traces.params import SamplingParams as SP

CASES = [
    SP(),
    SP(temperature=0.5),
    SP(temperature=2.0),
    SP(top_k=4),
    SP(top_p=0.7),
    SP(min_p=0.15),
    SP(temperature=1.5, top_k=8, top_p=0.9, min_p=0.05),
    SP(presence_penalty=1.0, frequency_penalty=0.5, repetition_penalty=1.5),
]


def param_id(p: SP) -> str:
    return msgspec.json.encode(p).decode()  # only the non-default fields


HISTORY = ([0, 1, 2, 3, 1, 1, 5], 3)


def history_of(p: SP):
    return HISTORY if p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty else None


def check_distribution(logits_row: torch.Tensor, p: SP, n: int, seed: int, sampler: Sampler | None = None) -> None:
    hist = history_of(p)
    got = draws(logits_row, p, n, seed=seed, history=hist, sampler=sampler)
    probs = reference_probs(logits_row.cpu().numpy(), p, hist)
    assert set(got.tolist()) <= set(np.flatnonzero(probs).tolist())
    counts = np.bincount(got, minlength=probs.size)
    ok, stat, crit = chi_square_ok(counts, probs)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f} for {p}"


def check_grid(logits_row: torch.Tensor, p: SP, n: int, sampler: Sampler) -> None:
    """Uniforms (i + 1/2) / n: each token gets its probability's share of them, to within one. The
    Triton kernel applies top-k / top-p by rejection (its rejected draws use uniforms of its own), so
    there the counts pass a chi-square test instead; deterministic either way."""
    hist = history_of(p)
    rngs = [GridPoint((i + 0.5) / n) for i in range(n)]
    batch = SamplingBatch.build([p] * n, rngs, [hist] * n if hist else None, logits_row.device)
    got = np.asarray(sampler.sample(logits_row.expand(n, -1).contiguous(), batch).token_ids)
    probs = reference_probs(logits_row.cpu().numpy(), p, hist)
    counts = np.bincount(got, minlength=probs.size)
    assert set(got.tolist()) <= set(np.flatnonzero(probs).tolist()), p
    if sampler.backend == "triton" and (p.top_k > 0 or p.top_p < 1):
        ok, stat, crit = chi_square_ok(counts, probs)
        assert ok, f"chi2 {stat:.1f} >= {crit:.1f} for {p}"
    else:
        assert np.abs(counts - n * probs).max() <= 1.0 + 1e-9, p


class GridPoint(random.Random):
    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


@pytest.mark.parametrize("p", CASES, ids=param_id)
def test_draws_follow_probabilities(p):
    row = torch.randn(24, generator=torch.Generator().manual_seed(3)) * 1.5
    check_distribution(row, p, 20000, seed=11)


@pytest.mark.parametrize("p", CASES, ids=param_id)
def test_a_grid_of_uniforms_lands_by_probability(p):
    row = torch.randn(24, generator=torch.Generator().manual_seed(3)) * 1.5
    check_grid(row, p, 4096, Sampler(backend="torch"))
