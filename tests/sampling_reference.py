"""A slow, obviously-correct float64 sampler to check runtime/executor/sampling.py against (test helper)."""

from __future__ import annotations

import random

import numpy as np
import torch

from runtime.executor.sampling import GREEDY_EPS, SampleOutput, Sampler, SamplingBatch, request_rng
from traces.params import SamplingParams


def penalised(logits: np.ndarray, p: SamplingParams, history: tuple[list[int], int] | None) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64).copy()
    if history is None:
        return x
    ids, n_prompt = list(history[0]), history[1]
    out = ids[n_prompt:]
    counts = np.bincount(np.asarray(out, dtype=np.int64), minlength=x.size).astype(np.float64)
    if p.repetition_penalty != 1:
        seen = counts > 0
        seen[np.asarray(ids, dtype=np.int64)] = True
        r = p.repetition_penalty
        x = np.where(seen, np.where(x > 0, x / r, x * r), x)
    return x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)


def reference_probs(logits: np.ndarray, p: SamplingParams,
                    history: tuple[list[int], int] | None = None) -> np.ndarray:
    """The distribution a request samples from: penalties, temperature, min-p, top-k, top-p."""
    x = penalised(logits, p, history)
    if p.temperature < GREEDY_EPS:
        out = np.zeros_like(x)
        out[int(np.argmax(x))] = 1.0
        return out
    x = x / p.temperature
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    keep = probs >= p.min_p * probs.max()
    if p.top_k:
        kth = np.sort(probs)[::-1][min(p.top_k, probs.size) - 1]
        keep &= probs >= kth
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
    if p.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(probs[order])[:-1]])
        cut = probs[order][before < p.top_p].min()
        probs = np.where(probs >= cut, probs, 0.0)
        probs /= probs.sum()
    return probs


def reference_draw(probs: np.ndarray, u: float) -> int:
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), np.flatnonzero(probs)[-1]))


def sample(logits: torch.Tensor, params: list[SamplingParams], rngs: list[random.Random | None],
           histories=None, sampler: Sampler | None = None) -> SampleOutput:
    batch = SamplingBatch.build(params, rngs, histories, logits.device)
    return (sampler or Sampler()).sample(logits, batch)


def draws(logits_row: torch.Tensor, p: SamplingParams, n: int, seed: int = 0, history=None,
          sampler: Sampler | None = None) -> np.ndarray:
    """n independent draws from one logits row: a batch of n copies, each with its own stream."""
    logits = logits_row.expand(n, -1).contiguous()
    rngs = [request_rng(seed, i, None) for i in range(n)]
    return np.asarray(sample(logits, [p] * n, rngs, [history] * n if history else None, sampler).token_ids)


def chi_square_ok(counts: np.ndarray, probs: np.ndarray, z: float = 3.72) -> tuple[bool, float, float]:
    """Pearson chi-square against ``probs`` (bins with expected < 5 merged); critical value at
    one-sided z (3.72 ≈ p = 1e-4) by the Wilson-Hilferty approximation. Returns (ok, stat, crit)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = list(counts[big]) + [counts[~big].sum()]
    exp = list(expected[big]) + [expected[~big].sum()]
    if exp[-1] < 5:  # fold the small remainder into the last big bin
        obs[-2] += obs.pop()
        exp[-2] += exp.pop()
    obs_a, exp_a = np.asarray(obs, dtype=np.float64), np.asarray(exp)
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    df = len(obs) - 1
    if df == 0:
        return bool(obs_a[0] == n), stat, 0.0
    crit = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
    return stat < crit, stat, crit
