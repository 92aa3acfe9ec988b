"""The acceptance rules of runtime/executor/speculative.py, by statistics on the CPU: the general
rejection sampler (drafts drawn from q, accepted with min(1, p/q), resampled from norm(max(p - q, 0)))
commits tokens distributed as the target's; with a one-hot q it is the runner's rule (sample the row,
accept when it equals the draft); the prefix rule and the stream rewind."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from runtime.executor.sampling_ops import inverse_cdf
from runtime.executor.speculative import Rewind, commit, num_accepted, rejection_sample, row_histories
from tests.sampling_reference import chi_square_ok

N = 40_000
V = 6


def _dist(gen, rows, v=V, zeros=True):
    x = torch.rand((rows, v), generator=gen, dtype=torch.float64) ** 2
    if zeros:
        x[:, 0] = 0.0  # a token the target never samples
    return x / x.sum(-1, keepdim=True)


def _draw(probs: torch.Tensor, gen) -> torch.Tensor:
    return inverse_cdf(probs, torch.rand(probs.shape[0], generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("seed", [0, 1])
def test_rejection_sampler_commits_the_targets_distribution(seed):
    """K = 2 drafts from q; the first committed token ~ p_0, the second (given the first draft was
    accepted) ~ p_1, the acceptance rate of the first draft sum(min(p_0, q_0))."""
    gen = torch.Generator().manual_seed(seed)
    p = _dist(gen, 3)  # positions 0, 1 and the bonus
    q = _dist(gen, 2, zeros=False)
    drafts = torch.stack([_draw(q[j].expand(N, V), gen) for j in range(2)], 1)
    accepted, token = rejection_sample(p.expand(N, 3, V), q.expand(N, 2, V), drafts,
                                       torch.rand((N, 2), generator=gen, dtype=torch.float64),
                                       torch.rand((N, 3), generator=gen, dtype=torch.float64))
    first = torch.where(accepted > 0, drafts[:, 0], token).numpy()
    ok, stat, crit = chi_square_ok(np.bincount(first, minlength=V), p[0].numpy())
    assert ok, (stat, crit)
    second = torch.where(accepted > 1, drafts[:, 1], token)[accepted > 0].numpy()
    ok, stat, crit = chi_square_ok(np.bincount(second, minlength=V), p[1].numpy())
    assert ok, (stat, crit)
    bonus = token[accepted == 2].numpy()
    ok, stat, crit = chi_square_ok(np.bincount(bonus, minlength=V), p[2].numpy())
    assert ok, (stat, crit)
    rate = float(torch.minimum(p[0], q[0]).sum())
    got = float((accepted > 0).double().mean())
    assert abs(got - rate) < 4 * (rate * (1 - rate) / N) ** 0.5
    assert int(token.min()) >= 0 and int(token.max()) < V and not (first == 0).any()


def test_one_hot_q_is_the_sample_and_compare_rule():
    """A deterministic drafter: q = onehot(d). Accepted with probability p(d); on a rejection the
    token ~ p without d. The runner's rule (sample x ~ p with one uniform, accept iff x == d) gives
    the same joint distribution of (accepted, token)."""
    gen = torch.Generator().manual_seed(7)
    p = _dist(gen, 2)
    d = torch.full((N, 1), 3, dtype=torch.long)
    q = torch.nn.functional.one_hot(d, V).double()
    accepted, token = rejection_sample(p.expand(N, 2, V), q, d, torch.rand((N, 1), generator=gen, dtype=torch.float64),
                                       torch.rand((N, 2), generator=gen, dtype=torch.float64))
    x = _draw(p[0].expand(N, V), gen)
    runner_accepted = x == 3
    general = np.where(accepted.numpy() > 0, V, token.numpy())  # outcome V: accepted (then a bonus from p_1)
    runner = np.where(runner_accepted.numpy(), V, x.numpy())
    want = np.append(p[0].numpy(), 0.0)
    want[V], want[3] = want[3], 0.0
    for outcomes in (general, runner):
        ok, stat, crit = chi_square_ok(np.bincount(outcomes, minlength=V + 1), want)
        assert ok, (stat, crit)
    ok, stat, crit = chi_square_ok(np.bincount(token[accepted > 0].numpy(), minlength=V), p[1].numpy())
    assert ok, (stat, crit)


def test_num_drafts_limits_each_row():
    """Requests with fewer drafts than K: the drafts past theirs are ignored, their bonus comes from
    the position after their last."""
    p = torch.zeros(2, 3, 4, dtype=torch.float64)
    p[:, :, 2] = 1.0  # the target always says 2
    p[:, 1, :] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # ... except at position 1: 1
    q = torch.nn.functional.one_hot(torch.tensor([[2, 1], [2, 1]]), 4).double()
    u = torch.full((2, 2), 0.5, dtype=torch.float64)
    accepted, token = rejection_sample(p, q, torch.tensor([[2, 1], [2, 1]]), u, torch.full((2, 3), 0.5).double(),
                                       torch.tensor([2, 1]))
    assert accepted.tolist() == [2, 1] and token.tolist() == [2, 1]


def test_prefix_rule_and_histories():
    assert num_accepted([5, 6, 7], [5, 6, 9, 1]) == 2
    assert commit([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert commit([5, 6, 7], [5, 6, 7, 1]) == [5, 6, 7, 1]
    assert commit([5], [4, 5]) == [4]
    rows = row_histories([1, 2, 3], 2, [8, 9])
    assert [list(h) for h, _ in rows] == [[1, 2, 3], [1, 2, 3, 8], [1, 2, 3, 8, 9]] and {n for _, n in rows} == {2}


def test_rewind_keeps_what_the_commit_used():
    a, b = random.Random(3), random.Random(3)
    rewind = Rewind(a, 4)
    drawn = [a.random() for _ in range(4)]
    rewind.keep(2)
    assert [b.random() for _ in range(2)] == drawn[:2] and a.random() == drawn[2] == b.random()
