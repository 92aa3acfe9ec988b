"""Top-k / top-p / min-p sampling without sorting (Triton): one program per row, a few passes
over its logits, no [B, V] intermediate.

The torch sampler (runtime/executor/sampling.py) sorts every row for top-p; on a 152k vocabulary
that sort and its float64 cumsum cost more than a decode step's forward. Here a row's filters are
value thresholds found by search, in the style of FlashInfer's sorting-free kernels, and the draw
is the same inverse CDF with the row's one uniform:

1. the row's max, and whether it holds NaN or +inf (the row is then flagged; greedy rows are
   the torch argmax's, runtime/executor/sampling_ops.py);
2. weights ``w = exp(l / T - max)`` (the best token weighs 1); min-p keeps ``w >= min_p``;
3. top-k: the largest ``t`` with ``count(w >= t) >= k`` is the k-th largest weight; top-p: the
   largest ``t`` with ``mass(w >= t) >= p * mass(kept)``. Both predicates fall as ``t`` grows,
   so each is a search over ``t``'s float32 bit pattern (ordered as the values are, for weights
   in [0, 1]): every pass counts or weighs ``NUM_PIVOTS`` candidates at once, so 2^30 patterns
   take 8 passes, and the result is exactly a weight of the row, ties kept, as the sort gives;
4. the kept mass in vocabulary order (float64), then the first kept token whose running mass
   passes ``u * total``: two passes with the same arithmetic, so the two agree to the bit.

A row's passes run in one program in a fixed order: its token depends on its logits and its
uniform only, never on the batch. Every filter arrives as an array (off is 0, V or 1), so the
kernel has four specialisations at most: logits bf16/fp16 or float32 (penalised), rows picked
out of the batch or all of it (runtime/serving/warmup.py runs them all). Against the torch
sampler it draws from the same distribution; the tokens are the same unless a rounding difference
(exp, the order of a sum) moves a boundary past a draw. Under TRITON_INTERPRET=1 it runs on the
CPU (numpy's exp for libdevice's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

NUM_PIVOTS = 16  # candidates per search pass: 15 intervals, 8 passes over 2^30 patterns
BLOCK = 1024  # logits per iteration of a plain pass
SEARCH_BLOCK = 256  # per iteration of a search pass (a [NUM_PIVOTS, SEARCH_BLOCK] tile)
ONE_BITS = 0x3F800000  # 1.0f's bit pattern: no weight is above it


@triton.jit
def _search(base, V, t, xmax, lo, k, p, LIBDEVICE: tl.constexpr, MASS: tl.constexpr,
            NPIV: tl.constexpr, SB: tl.constexpr, ONE: tl.constexpr):
    """The largest bit pattern t in [lo, ONE] with count(w >= t) >= k (MASS False) or
    mass(w >= t) >= p * mass(w >= lo) (MASS True); ``lo`` when none."""
    hi = tl.full((), ONE, tl.int32)
    steps = tl.arange(0, NPIV).to(tl.int64)
    offs = tl.arange(0, SB)
    target = tl.full((), -1.0, tl.float64)
    while lo < hi:
        piv = (lo.to(tl.int64) + (hi - lo).to(tl.int64) * steps // (NPIV - 1)).to(tl.int32)  # piv[0] = lo
        pf = piv.to(tl.float32, bitcast=True)
        acc = tl.zeros([NPIV], tl.float64)
        for start in range(0, V, SB):
            idx = start + offs
            mask = idx < V
            x = tl.div_rn(tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32), t) - xmax
            if LIBDEVICE:  # (inline, not a helper: the interpreter pays per call)
                w = libdevice.exp(x)
            else:
                w = tl.exp(x)
            ge = (w[None, :] >= pf[:, None]) & mask[None, :]
            if MASS:  # float64, as the sort's cumsum: a boundary moves only where float64 rounds
                acc += tl.sum(tl.where(ge, w.to(tl.float64)[None, :], 0.0), 1)
            else:
                acc += tl.sum(ge.to(tl.int32), 1).to(tl.float64)
        if MASS:
            if target < 0:  # the first pass weighed lo = the kept mass
                target = p * tl.sum(tl.where(steps == 0, acc, 0.0), 0)
            ok = acc >= target
        else:
            ok = acc >= k
        new_lo = tl.max(tl.where(ok, piv, lo), 0)  # ok holds for a prefix of the pivots
        hi = tl.min(tl.where(ok, hi, piv - 1), 0)
        lo = new_lo
    return lo


@triton.jit(do_not_specialize=["S"])  # the batch size: one compilation for all of them
def _sample_kernel(logits_ptr, stride, rows_ptr, temp_ptr, u_ptr, filters_ptr, S, ids_ptr, bad_ptr, V,
                   HAS_ROWS: tl.constexpr, LIBDEVICE: tl.constexpr, NPIV: tl.constexpr,
                   B: tl.constexpr, SB: tl.constexpr, ONE: tl.constexpr):
    r = tl.program_id(0)
    if HAS_ROWS:
        row = tl.load(rows_ptr + r)
    else:
        row = r.to(tl.int64)
    base = logits_ptr + row * stride
    t = tl.load(temp_ptr + r)
    offs = tl.arange(0, B)

    # 1. the max, and whether the row holds NaN or +inf (the max of float32 ignores NaN)
    top = tl.full((), float("-inf"), tl.float32)
    nonfinite = tl.zeros((), tl.int32)
    for start in range(0, V, B):
        idx = start + offs
        logits = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        top = tl.maximum(top, tl.max(logits, 0))
        nonfinite += tl.sum(((logits != logits) | (logits == float("inf"))).to(tl.int32), 0)
    xmax = tl.div_rn(top, t)
    bad = (nonfinite > 0) | (xmax != xmax) | (xmax == float("inf")) | (xmax == float("-inf"))
    xmax = tl.where(bad, 0.0, xmax)

    # 2-3. the threshold: min-p, then top-k, then top-p over what they kept (a row skips what is off)
    thr = tl.load(filters_ptr + r).to(tl.float32).to(tl.int32, bitcast=True)
    k = tl.load(filters_ptr + S + r)
    if k < V:
        thr = _search(base, V, t, xmax, thr, k, 1.0, LIBDEVICE, False, NPIV, SB, ONE)
    p = tl.load(filters_ptr + 2 * S + r)
    if p < 1.0:
        thr = _search(base, V, t, xmax, thr, 0.0, p, LIBDEVICE, True, NPIV, SB, ONE)
    thr_f = thr.to(tl.float32, bitcast=True)

    # 4. the kept mass, then the first kept token past u * total: the same sums both times
    total = tl.zeros((), tl.float64)
    target = tl.zeros((), tl.float64)
    last_kept = tl.zeros((), tl.int32)
    chosen = tl.full((), V, tl.int32)
    for phase in tl.static_range(2):
        running = tl.zeros((), tl.float64)
        for start in range(0, V, B):
            idx = start + offs
            mask = idx < V
            x = tl.div_rn(tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32), t) - xmax
            if LIBDEVICE:
                w = libdevice.exp(x)
            else:
                w = tl.exp(x)
            keep = (w >= thr_f) & (w > 0) & mask
            c = running + tl.cumsum(tl.where(keep, w, 0.0).to(tl.float64), 0)
            running = tl.max(c, 0)
            if phase == 0:
                last_kept = tl.maximum(last_kept, tl.max(tl.where(keep, idx, 0), 0))
            else:
                chosen = tl.minimum(chosen, tl.min(tl.where(keep & (c > target), idx, V), 0))
        if phase == 0:
            total = running
            target = tl.load(u_ptr + r) * total
    chosen = tl.where(chosen < V, chosen, last_kept)  # u * total rounded up to the total
    tl.store(ids_ptr + r, chosen.to(tl.int64))
    tl.store(bad_ptr + r, bad)


_COMPILED = isinstance(_sample_kernel, triton.runtime.JITFunction)  # False under TRITON_INTERPRET=1


def sample_rows(logits: torch.Tensor, rows: torch.Tensor | None, temperature: torch.Tensor, uniforms: torch.Tensor,
                filters: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sampled row: ``rows`` [S] int64 rows of ``logits`` [B, V] (None: every row);
    ``temperature`` [S] float32 (>= the greedy cut-off), ``uniforms`` [S] float64 in [0, 1),
    ``filters`` [3, S] float64: min_p (0 = off), top_k (V or more = off), top_p (1 = off).
    Returns [S] int64 ids and [S] bool: the row was not finite."""
    s, v = temperature.shape[0], logits.shape[1]
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty(s, dtype=torch.int64, device=logits.device)
    bad = torch.empty(s, dtype=torch.bool, device=logits.device)
    if s == 0:
        return ids, bad
    rows_or_any = rows if rows is not None else uniforms  # (not read without rows)
    _sample_kernel[(s,)](
        logits, logits.stride(0), rows_or_any, temperature, uniforms, filters.contiguous(), s, ids, bad, v,
        HAS_ROWS=rows is not None, LIBDEVICE=_COMPILED, NPIV=NUM_PIVOTS, B=BLOCK, SB=SEARCH_BLOCK, ONE=ONE_BITS,
        num_warps=8)
    return ids, bad
