"""Device-side tensor steps of the sampler (runtime/executor/sampling.py drives them).

Every function here is row-wise: the result for a row depends only on that row's values and
parameters, never on the other rows or on the batch size, so a request draws the same token alone
or inside any batch. Three rules keep that true on CUDA as well as on the CPU:

* filters are *value thresholds* (keep ``w >= thr``), never "the first n positions of a sort":
  the sorted sequence of values is unique even when ties are ordered differently;
* sums that decide a token are float64 ``cumsum`` along the row (a per-row scan), never a
  ``sum`` reduction whose split depends on the tensor shape;
* ``row_cumsum`` pads a single-row input on CUDA: torch uses a different (CUB) scan when the
  tensor has one row, and a request must not see other rounding when it is alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# topk is cheaper than a full sort when few values are needed; past this a sort is used
_TOPK_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class PenaltyTensors:
    """Penalty inputs for the R rows that use any penalty (device tensors)."""

    rows: torch.Tensor  # [R] int64: rows of the logits
    repetition: torch.Tensor  # [R] float32
    frequency: torch.Tensor  # [R] float32
    presence: torch.Tensor  # [R] float32
    out_rows: torch.Tensor  # [N] int64: 0..R-1, one per output token of those rows
    out_tokens: torch.Tensor  # [N] int64
    prompt_rows: torch.Tensor  # [M] int64 (only rows with repetition_penalty != 1)
    prompt_tokens: torch.Tensor  # [M] int64
    any_repetition: bool


def apply_penalties(logits: torch.Tensor, pen: PenaltyTensors) -> torch.Tensor:
    """vLLM semantics: repetition over prompt + output, then frequency and presence over output.

    Returns a new float32 tensor; ``logits`` is left untouched (raw logprobs read it later). Only
    the logits of tokens in a history change, so only those are computed: gathered at the
    (row, token) pairs, penalised, written back (a pair met twice writes the same value twice).
    The counts are the one [R, V] buffer, zeroed, filled by the output pairs.
    """
    out = logits.float()
    if out is logits:
        out = out.clone()
    v = out.shape[1]
    counts = torch.zeros((pen.rows.shape[0], v), dtype=out.dtype, device=out.device)
    ones = torch.ones(pen.out_tokens.shape[0], dtype=out.dtype, device=out.device)
    counts.index_put_((pen.out_rows, pen.out_tokens), ones, accumulate=True)  # integers: exact
    pair_rows, pair_tokens = pen.out_rows, pen.out_tokens
    if pen.any_repetition:  # the prompt's tokens are seen too
        pair_rows, pair_tokens = torch.cat([pair_rows, pen.prompt_rows]), torch.cat([pair_tokens, pen.prompt_tokens])
    flat = pen.rows.index_select(0, pair_rows) * v + pair_tokens
    x = out.view(-1).index_select(0, flat)
    n = counts.view(-1).index_select(0, pair_rows * v + pair_tokens)
    r = pen.repetition.index_select(0, pair_rows)
    x = torch.where(x > 0, x / r, x * r)  # (r == 1: x itself, exactly)
    x = x - pen.frequency.index_select(0, pair_rows) * n - pen.presence.index_select(0, pair_rows) * (n > 0)
    out.view(-1).index_copy_(0, flat, x)
    return out


def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """float64 inclusive cumsum along the last dim of a 2-D tensor, batch-size independent."""
    if not x.is_cuda:
        return x.double().cumsum(-1)  # same values as dtype=float64, several times faster on CPU
    if x.shape[0] == 1:
        return torch.cumsum(torch.cat([x, torch.zeros_like(x)]), -1, dtype=torch.float64)[:1]
    return torch.cumsum(x, -1, dtype=torch.float64)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """First index of the maximum of each row ([B] int64)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(x.detach().numpy().argmax(-1))  # ~10x faster than torch's CPU argmax
    return x.argmax(-1)


def checked_argmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``row_argmax`` and, per row, whether its logits were not finite: the maximum is NaN when a
    NaN is anywhere in the row (both numpy and torch pick it), +inf, or -inf when every value is."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        a = x.detach().numpy()
        ids = a.argmax(-1)
        top = a[np.arange(a.shape[0]), ids]
        return torch.from_numpy(ids), torch.from_numpy(~np.isfinite(top))
    top, ids = x.max(-1)
    return ids, ~torch.isfinite(top)


def sorted_desc(w: torch.Tensor, kmax: int) -> torch.Tensor:
    """The ``kmax`` largest values of each row, descending (a full sort when kmax is large).

    Only values are needed, and a sorted sequence of values is unique, so any sort gives the
    same result: on the CPU numpy's sort (~30x faster than torch's there).
    """
    if kmax < min(_TOPK_LIMIT, w.shape[1]):
        return torch.topk(w, kmax, dim=-1, sorted=True).values
    if w.device.type == "cpu":
        return torch.from_numpy(np.ascontiguousarray(np.sort(w.numpy(), -1)[:, ::-1]))
    return torch.sort(w, dim=-1, descending=True).values


def top_k_top_p_threshold(
    w: torch.Tensor, floor: torch.Tensor, k: torch.Tensor, kmax: int,
    p: torch.Tensor | None,
) -> torch.Tensor:
    """Per-row weight threshold that applies top-k, then top-p on what top-k (and ``floor``) kept.

    ``w``: [R, V] weights exp(l - max), so the best token has weight 1; ``floor``: [R] thresholds
    applied before (min-p); ``k``: [R] int64 in 1..V (V = off); ``p``: [R] float64 or None (off
    for every row). Top-p keeps the smallest prefix of the descending order whose mass reaches
    p, like vLLM: token j stays when the mass strictly before it is < p · total. Ties at a
    threshold are all kept.
    """
    vals = sorted_desc(w, kmax if p is None else w.shape[1])
    kth = vals.gather(1, (k - 1).clamp_(max=vals.shape[1] - 1)[:, None]).squeeze(1)
    thr = torch.maximum(floor, kth)
    if p is None:
        return thr
    vals = vals.masked_fill(vals < thr[:, None], 0.0)
    cdf = row_cumsum(vals)
    target = p[:, None] * cdf[:, -1:]
    n_keep = 1 + (cdf[:, :-1] < target).sum(-1)  # a count, exact whatever the reduction order
    thr_p = vals.gather(1, (n_keep - 1)[:, None]).squeeze(1)
    return torch.where(p < 1.0, torch.maximum(thr, thr_p), thr)


def inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token of each row drawn by inverse CDF over unnormalised weights ``w`` [R, V] with the
    row's uniform ``u`` [R] float64 in [0, 1). Returns [R] int64.

    The CDF runs in vocabulary order (any fixed order is a valid inverse CDF). ``u · total`` is
    clamped below the total so rounding can never step past the last kept token.
    """
    cdf = row_cumsum(w)
    total = cdf[:, -1:]
    x = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).squeeze(1)
