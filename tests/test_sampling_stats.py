"""The distribution of draws matches the reference probabilities (chi-square, fixed seeds)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

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


def check_distribution(logits_row: torch.Tensor, p: SP, n: int, seed: int) -> None:
    hist = HISTORY if p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty else None
    got = draws(logits_row, p, n, seed=seed, history=hist)
    probs = reference_probs(logits_row.cpu().numpy(), p, hist)
    assert set(got.tolist()) <= set(np.flatnonzero(probs).tolist())
    counts = np.bincount(got, minlength=probs.size)
    ok, stat, crit = chi_square_ok(counts, probs)
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f} for {p}"


@pytest.mark.parametrize("p", CASES, ids=param_id)
def test_draws_follow_probabilities(p):
    row = torch.randn(24, generator=torch.Generator().manual_seed(3)) * 1.5
    check_distribution(row, p, 20000, seed=11)
