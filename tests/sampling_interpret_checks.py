"""The sorting-free sampling kernel (runtime/executor/kernels/sampling.py) on the CPU under
``TRITON_INTERPRET=1``, against the torch sampler and the float64 reference (see
test_sampling_kernel_interpret.py). Run as a script: prints one JSON line ``{name: "ok" | error}``.
Small vocabularies: the interpreter is numpy, a few ms per operation.

Without top-k and top-p the kernel's draw is the torch sampler's inverse CDF: the same tokens. With
them it draws by rejection, so its tokens are checked against the reference distribution instead:
in its support, and a chi-square test of the draws at a grid of first uniforms."""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from runtime.executor.sampling import Sampler, SamplingBatch, request_rng  # noqa: E402
from tests.sampling_reference import reference_probs  # noqa: E402
from tests.test_sampling_stats import CASES, HISTORY, chi_square_ok  # noqa: E402
from traces.params import SamplingParams as SP  # noqa: E402

KERNEL, TORCH = Sampler(backend="triton"), Sampler(backend="torch")
MIXED = [SP(), SP(temperature=0), SP(temperature=0.7), SP(top_k=5), SP(top_p=0.8), SP(min_p=0.05),
         SP(temperature=1.3, top_k=10, top_p=0.9, min_p=0.02), SP(top_k=1), SP(top_p=0.5, top_k=3),
         SP(top_p=1e-300), SP(min_p=1.0), SP(top_k=1000), SP(repetition_penalty=1.5, presence_penalty=1.0),
         SP(temperature=0, frequency_penalty=0.5), SP(top_p=0.95, temperature=0.8), SP(temperature=2e-5)]


class Fixed(random.Random):
    """A stream that always returns ``u``."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


def _filtered(p: SP) -> bool:
    """Top-k or top-p: the kernel draws by rejection (another route to the same distribution)."""
    return p.temperature > 0 and (p.top_k > 0 or p.top_p < 1)


def _agree(logits, params, hists, got, want):
    """Same token as torch for unfiltered rows; a token of the reference's support for the others."""
    for i, p in enumerate(params):
        if _filtered(p):
            h = hists[i] if hists else None
            probs = reference_probs(logits[i].float().numpy(), p, h)
            assert probs[got[i]] > 0, (i, p, got[i])
        else:
            assert got[i] == want[i], (i, p, got[i], want[i])


def _both(logits, params, us, hists=None):
    """(kernel ids, torch ids, kernel nonfinite) for rows drawing the uniforms ``us``."""
    out = []
    for sampler in (KERNEL, TORCH):
        rngs = [None if p.temperature == 0 else Fixed(u) for p, u in zip(params, us)]
        batch = SamplingBatch.build(params, rngs, hists, "cpu", logits.shape[1])
        out.append(sampler.sample(logits, batch))
    return out[0].token_ids, out[1].token_ids, out[0].nonfinite


def same_tokens_as_torch():
    gen = torch.Generator().manual_seed(0)
    hists = [([1, 2, 3, 2, 7], 2)] * len(MIXED)
    for step in range(4):
        logits = torch.randn(len(MIXED), 40, generator=gen) * 3
        us = [request_rng(step, i, None).random() for i in range(len(MIXED))]
        got, want, bad = _both(logits, MIXED, us, hists)
        assert bad == (), step
        _agree(logits, MIXED, hists, got, want)
    # bf16 logits, and rows picked out of a larger batch (greedy rows between them)
    logits = (torch.randn(len(MIXED), 40, generator=gen) * 3).bfloat16()
    got, want, _ = _both(logits, MIXED, [0.37] * len(MIXED), hists)
    _agree(logits, MIXED, hists, got, want)


def stratified_distribution():
    """Uniforms on a grid (i + 1/2) / N. Unfiltered: the share of them landing on each token is its
    probability to within 1/N, deterministically (the inverse CDF's quadrature). Top-k / top-p:
    the first draws are that quadrature over a superset, the rejected ones drawn again from Philox;
    a chi-square test of the counts (deterministic: the same uniforms every run)."""
    row = torch.randn(24, generator=torch.Generator().manual_seed(3)) * 1.5
    for p in CASES:
        n = 128 if _filtered(p) else 64
        hist = HISTORY if p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty else None
        us = [(i + 0.5) / n for i in range(n)]
        got, want, _ = _both(row.expand(n, -1).contiguous(), [p] * n, us, [hist] * n if hist else None)
        probs = reference_probs(row.numpy(), p, hist)
        counts = np.bincount(got, minlength=probs.size)
        assert set(got) <= set(np.flatnonzero(probs).tolist()), p
        if _filtered(p):
            ok, stat, crit = chi_square_ok(counts, probs)
            assert ok, (p, stat, crit, counts.tolist(), (n * probs).round(2).tolist())
        else:
            assert np.abs(counts - n * probs).max() <= 1.0 + 1e-9, (p, counts.tolist(), (n * probs).round(2).tolist())
            assert got == want, p


def non_finite_rows():
    x = torch.randn(5, 30, generator=torch.Generator().manual_seed(1))
    x[1, 4] = float("nan")
    x[2] = float("nan")
    x[3, 9] = float("inf")
    x[4] = float("-inf")
    params = [SP(top_p=0.9), SP(), SP(top_k=3), SP(min_p=0.1), SP(top_p=0.5, top_k=2)]
    got, want, bad = _both(x, params, [0.5] * 5)
    assert set(bad) == {1, 2, 3, 4} and all(0 <= t < 30 for t in got), (bad, got)
    _agree(x[:1], params[:1], None, got[:1], want[:1])
    over = torch.zeros(1, 30)
    over[0, 0] = 3e38  # finite, but past float32 once divided by the temperature
    _, _, bad = _both(over, [SP(temperature=1e-4)], [0.5])
    assert bad == (0,)


def alone_equals_in_batch():
    gen = torch.Generator().manual_seed(2)
    mine = SP(temperature=0.9, top_k=7, top_p=0.9, min_p=0.01)
    others = [SP(), SP(temperature=0), SP(top_p=0.3), SP(top_k=2), SP(min_p=0.5)]
    for s in range(6):
        row = torch.randn(1, 50, generator=gen) * 2
        u = random.Random(s).random()
        alone = _both(row, [mine], [u])[0][0]
        batch = torch.cat([torch.randn(3, 50, generator=gen), row, torch.randn(2, 50, generator=gen)])
        params = [others[(s + i) % 5] for i in range(3)] + [mine] + [others[(s + i) % 5] for i in range(2)]
        assert _both(batch, params, [random.Random(i).random() for i in range(3)] + [u, 0.1, 0.9])[0][3] == alone


def edges():
    row = torch.tensor([[0.0, -float("inf"), 1.0, 2.0, -float("inf"), 2.0, 2.0]])
    last = 1 - 2**-53
    assert _both(row, [SP()], [last])[:2] == ([6], [6])  # never a -inf token, whatever u
    assert _both(row, [SP()], [0.0])[:2] == ([0], [0])
    # ties at the k-th value are all kept: u = 0 first lands on token 0, rejected, then on a tie
    assert _both(row, [SP(top_k=1)], [0.0])[1] == [3] and _both(row, [SP(top_k=1)], [0.0])[0][0] in (3, 5, 6)
    assert _both(row, [SP(top_k=1)], [last])[:2] == ([6], [6])  # the first draw is kept
    assert _both(row, [SP(top_p=1e-300)], [0.6])[:2] == ([5], [5])
    assert _both(row, [SP(min_p=1.0)], [0.99])[:2] == ([6], [6])
    flat = torch.zeros(1, 3000)  # more than one block of a search pass
    flat[0, 2999] = 1e-3
    assert _both(flat, [SP(top_p=1e-6)], [0.9])[:2] == ([2999], [2999])
    for us in ([0.999], [0.2]):  # top-k search (ties: all 3000 kept), then top-p by rejection
        got, want, _ = _both(flat, [SP(top_k=2500, top_p=0.5)], us)
        _agree(flat, [SP(top_k=2500, top_p=0.5)], None, got, want)


CHECKS = [same_tokens_as_torch, stratified_distribution, non_finite_rows, alone_equals_in_batch, edges]

if __name__ == "__main__":
    results = {}
    for check in CHECKS:
        try:
            check()
            results[check.__name__] = "ok"
        except Exception:  # reported per check by the test module
            results[check.__name__] = traceback.format_exc()[-3000:]
    print(json.dumps(results))
