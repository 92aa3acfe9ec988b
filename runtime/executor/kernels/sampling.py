"""Top-k / top-p / min-p sampling without sorting (Triton): one program per row, two or three
passes over its logits in the common case, no [B, V] intermediate.

The torch sampler (runtime/executor/sampling.py) sorts every row for top-p; on a 152k vocabulary
that sort and its float64 cumsums cost more than a decode step's forward. Here top-k and top-p are
applied by rejection, in the style of FlashInfer's sorting-free kernels: draw a token from the
weights that pass the row's lower bound, then check whether it survives the filters, which is one
pass (the mass and the count of the tokens that weigh more than it); if it does not, raise the
bound past it and draw again. Each proposal is proportional to the weights on a superset of the
kept set and is accepted exactly when it is in that set, so the accepted token follows the
filtered distribution; the best token (weight 1) always passes, so the loop ends, and a draw is
accepted with probability at least top_p. Per row:

1. one pass: the max, whether the row holds NaN or +inf (it is then flagged and draws token 0;
   greedy rows are the torch argmax's, runtime/executor/sampling_ops.py) and, online, the mass of
   the weights ``w = exp(l / T - max)`` (the best token weighs 1);
2. the lower bound: min-p keeps ``w >= min_p``; when top-k and top-p are both on, top-p acts on
   what top-k kept, so the k-th largest weight is found first, by a search over float32 bit
   patterns (16 candidates a pass, ties kept); then the kept mass is counted again;
3. the draw: the first kept token whose running mass (float64, vocabulary order) passes
   ``u * mass``: the inverse CDF, stopping at the block that holds it;
4. the check, when top-k or top-p is on: the token stays when fewer than k tokens weigh more
   than it and their mass is below ``top_p`` times the kept mass (vLLM's rule: ties at the boundary
   are kept). A rejected row draws its next uniform from Philox keyed by its first one.

The first draw uses the row's uniform from the host: without top-k and top-p the token is the
torch sampler's inverse CDF (the same unless a rounding difference moves a boundary past a draw);
with them, the same distribution by another route. A row's work runs in one program in a fixed
order: its token depends on its logits and its uniform only, never on the batch. Every filter
arrives as an array (off is 0, V or 1), so the kernel has four specialisations at most: logits
bf16/fp16 or float32 (penalised), rows picked out of the batch or all of it
(runtime/serving/warmup.py runs them all). Under TRITON_INTERPRET=1 it runs on the CPU (numpy's
exp for libdevice's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

NUM_PIVOTS = 16  # candidates per top-k search pass: 15 intervals, 8 passes over 2^30 patterns
BLOCK = 8192  # logits per iteration of a pass (with NUM_WARPS: the fastest measured on the H200)
SEARCH_BLOCK = 1024  # per iteration of a search pass (a [NUM_PIVOTS, SEARCH_BLOCK] tile)
NUM_WARPS = 16
ONE_BITS = 0x3F800000  # 1.0f's bit pattern: no weight is above it


@triton.jit
def _weights(base, idx, mask, t, xmax, LIBDEVICE: tl.constexpr):
    x = tl.div_rn(tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32), t) - xmax
    if LIBDEVICE:
        return libdevice.exp(x)
    return tl.exp(x)


@triton.jit
def _above(base, V, t, xmax, thr, LIBDEVICE: tl.constexpr, B: tl.constexpr):
    """(mass float64, count) of the weights w >= thr > 0."""
    offs = tl.arange(0, B)
    mass = tl.zeros([B], tl.float64)
    count = tl.zeros([B], tl.int32)
    for start in range(0, V, B):
        idx = start + offs
        mask = idx < V
        w = _weights(base, idx, mask, t, xmax, LIBDEVICE)
        ge = (w >= thr) & mask
        mass += tl.where(ge, w, 0.0).to(tl.float64)
        count += ge.to(tl.int32)
    return tl.sum(mass, 0), tl.sum(count, 0)


@triton.jit
def _kth_weight(base, V, t, xmax, lo, k, LIBDEVICE: tl.constexpr, NPIV: tl.constexpr, SB: tl.constexpr,
                ONE: tl.constexpr):
    """The largest bit pattern t in [lo, ONE] with count(w >= t) >= k; ``lo`` when none."""
    hi = tl.full((), ONE, tl.int32)
    steps = tl.arange(0, NPIV).to(tl.int64)
    offs = tl.arange(0, SB)
    while lo < hi:
        piv = (lo.to(tl.int64) + (hi - lo).to(tl.int64) * steps // (NPIV - 1)).to(tl.int32)  # piv[0] = lo
        pf = piv.to(tl.float32, bitcast=True)
        acc = tl.zeros([NPIV, SB], tl.int32)
        for start in range(0, V, SB):
            idx = start + offs
            mask = idx < V
            w = _weights(base, idx, mask, t, xmax, LIBDEVICE)
            acc += ((w[None, :] >= pf[:, None]) & mask[None, :]).to(tl.int32)
        ok = tl.sum(acc, 1) >= k
        new_lo = tl.max(tl.where(ok, piv, lo), 0)  # ok holds for a prefix of the pivots
        hi = tl.min(tl.where(ok, hi, piv - 1), 0)
        lo = new_lo
    return lo


@triton.jit
def _draw(base, V, t, xmax, thr, target, LIBDEVICE: tl.constexpr, B: tl.constexpr):
    """The first token with w >= thr (and w > 0) whose running mass passes ``target``; the last
    such token when rounding leaves ``target`` at or past the total. Returns (id, its weight)."""
    offs = tl.arange(0, B)
    running = tl.zeros((), tl.float64)
    chosen = tl.full((), V, tl.int32)
    last = tl.zeros((), tl.int32)
    start = 0
    while (chosen == V) & (start < V):
        idx = start + offs
        mask = idx < V
        w = _weights(base, idx, mask, t, xmax, LIBDEVICE)
        keep = (w >= thr) & (w > 0) & mask
        c = running + tl.cumsum(tl.where(keep, w, 0.0).to(tl.float64), 0)
        chosen = tl.min(tl.where(keep & (c > target), idx, V), 0)
        last = tl.maximum(last, tl.max(tl.where(keep, idx, 0), 0))
        running = tl.max(c, 0)
        start += B
    chosen = tl.where(chosen < V, chosen, last)
    one = tl.arange(0, 1) + chosen
    w_one = _weights(base, one, one < V, t, xmax, LIBDEVICE)
    return chosen, tl.sum(w_one, 0)


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

    # 1. per lane: the max of l / T, the mass below it (rescaled as the max grows), NaN / +inf seen
    m = tl.full([B], float("-inf"), tl.float32)
    s = tl.zeros([B], tl.float64)
    nonfinite = tl.zeros([B], tl.int32)
    for start in range(0, V, B):
        idx = start + offs
        logits = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        nonfinite += ((logits != logits) | (logits == float("inf"))).to(tl.int32)
        x = tl.div_rn(logits, t)
        m_new = tl.maximum(m, x)
        seen = m_new > float("-inf")
        if LIBDEVICE:
            rescale = libdevice.exp(m - m_new)
            w = libdevice.exp(x - m_new)
        else:
            rescale = tl.exp(m - m_new)
            w = tl.exp(x - m_new)
        s = tl.where(seen, s * rescale.to(tl.float64) + w.to(tl.float64), 0.0)
        m = m_new
    xmax = tl.max(m, 0)
    bad = (tl.sum(nonfinite, 0) > 0) | (xmax != xmax) | (xmax == float("inf")) | (xmax == float("-inf"))
    xmax = tl.where(bad, 0.0, xmax)
    if LIBDEVICE:
        lane_scale = libdevice.exp(m - xmax)
    else:
        lane_scale = tl.exp(m - xmax)
    total = tl.sum(tl.where(m > float("-inf"), s * lane_scale.to(tl.float64), 0.0), 0)

    # 2. the lower bound (min-p; with top-k and top-p both on, also the k-th weight) and its mass
    lo = tl.load(filters_ptr + r).to(tl.float32).to(tl.int32, bitcast=True)
    k = tl.load(filters_ptr + S + r)
    p = tl.load(filters_ptr + 2 * S + r)
    if (k < V) & (p < 1.0):
        lo = _kth_weight(base, V, t, xmax, lo, k, LIBDEVICE, NPIV, SB, ONE)
    if lo > 0:
        total = _above(base, V, t, xmax, lo.to(tl.float32, bitcast=True), LIBDEVICE, B)[0]
    kept = total

    # 3-4. draw, check, and draw again above a rejected token
    u0 = tl.load(u_ptr + r)
    u = u0
    key = u0.to(tl.int64, bitcast=True)
    thr = lo
    rounds = tl.zeros((), tl.int32)
    chosen = tl.zeros((), tl.int32)
    done = bad.to(tl.int32)
    while done == 0:
        chosen, w = _draw(base, V, t, xmax, thr.to(tl.float32, bitcast=True), u * total, LIBDEVICE, B)
        done = ((k >= V) & (p >= 1.0)).to(tl.int32)
        if done == 0:
            up = w.to(tl.int32, bitcast=True) + 1  # the next float32 above w
            mass_gt, count_gt = _above(base, V, t, xmax, up.to(tl.float32, bitcast=True), LIBDEVICE, B)
            done = ((count_gt < k) & ((p >= 1.0) | (mass_gt < p * kept))).to(tl.int32)
            thr = up
            total = mass_gt
            rounds += 1
            a, b, _c, _d = tl.randint4x(key, rounds)
            u = ((a >> 5).to(tl.float64) * 67108864.0 + (b >> 6).to(tl.float64)) * (1.0 / 9007199254740992.0)
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
    block = min(BLOCK, triton.next_power_of_2(v))  # (a small vocabulary: small tiles)
    _sample_kernel[(s,)](
        logits, logits.stride(0), rows_or_any, temperature, uniforms, filters.contiguous(), s, ids, bad, v,
        HAS_ROWS=rows is not None, LIBDEVICE=_COMPILED, NPIV=NUM_PIVOTS, B=block, SB=min(SEARCH_BLOCK, block),
        ONE=ONE_BITS, num_warps=NUM_WARPS)
    return ids, bad
