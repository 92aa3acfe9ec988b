"""Verifying speculative drafts: which of a span's drafts the target accepts, and what it commits.

A speculating span (``StepPlan.drafts``, runtime/engine/drafters.py) is its request's last token
and D drafts d_1..d_D: D + 1 positions. The runner asks for the logits of all of them
(``host_inputs`` lists D + 1 ``logits_indices`` for it) and samples one row per position exactly as
the plain sampler samples a decode: the request's parameters, its own random stream (one uniform
per row, in row order), penalties over its history and the drafts before that row. Row j's token
x_j is what the target would sample after the committed tokens and d_1..d_j.

Acceptance (deterministic drafters: a draft's probability under its drafter is one, q = onehot(d)):
the longest prefix with x_j == d_{j+1} is accepted, a drafts; the span commits d_1..d_a and x_a
(the target's own token at the first mismatch, or the bonus token after the last draft). Each draft
is accepted with probability p(d), and on a rejection x_a is distributed as p conditioned on
x != d, which is norm(max(p - onehot(d), 0)): the general rule below with q one-hot, so the output
is distributed as the target's and greedy output equals non-speculative greedy output.

The uniforms of the rows after a span's last committed one decided nothing (the commit reads rows
0..a only), so the runner gives them back to the request's stream (``Rewind``): a request consumes
one uniform per committed token, as without speculation, and its sampled tokens are the very tokens
a non-speculative run with the same seed samples (logits equal, up to the rounding of the forward).

``rejection_sample`` is the general rule, for drafters that give draft probabilities q: accept d
with min(1, p(d) / q(d)), on a rejection sample from norm(max(p - q, 0)).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from runtime.executor import sampling_ops as ops
from traces.speculation import num_accepted


def commit(drafts: Sequence[int], sampled: Sequence[int]) -> list[int]:
    """What a speculating span commits: its accepted drafts and the row token after them."""
    a = num_accepted(drafts, sampled)
    return [*drafts[:a], sampled[a]]


def row_histories(token_ids, num_prompt: int, drafts: Sequence[int]) -> list[tuple[object, int]]:
    """Per row of a speculating span, the history its penalties see: the committed tokens and the
    drafts before the row."""
    import numpy as np

    base = np.asarray(token_ids, dtype=np.int64)
    extra = np.asarray(drafts, dtype=np.int64)
    return [(base, num_prompt)] + [(np.concatenate([base, extra[:j]]), num_prompt) for j in range(1, len(drafts) + 1)]


class Rewind:
    """A request's random stream as it was before a speculating span drew its rows' uniforms:
    ``keep(n)`` leaves it as if only the first ``n`` rows had drawn."""

    __slots__ = ("rng", "state", "drawn")

    def __init__(self, rng: random.Random, drawn: int) -> None:
        self.rng, self.state, self.drawn = rng, rng.getstate(), drawn

    def keep(self, n: int) -> None:
        if n >= self.drawn:
            return
        rng = self.rng
        rng.setstate(self.state)
        for _ in range(n):
            rng.random()


@torch.inference_mode()
def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_ids: torch.Tensor,
                     u_accept: torch.Tensor, u_resample: torch.Tensor,
                     num_drafts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless verification of drafts drawn from known draft distributions, batched over B requests.

    ``target_probs`` [B, K + 1, V]: the target's distribution at each position (after its filters);
    ``draft_probs`` [B, K, V]: the distribution each draft was drawn from; ``draft_ids`` [B, K];
    ``u_accept`` [B, K] and ``u_resample`` [B, K + 1]: independent uniforms in [0, 1);
    ``num_drafts`` [B]: the drafts each request really has (default K; later ones are ignored).

    Draft j is accepted with probability min(1, p_j(d_j) / q_j(d_j)) while every draft before it
    was; at the first rejected position a token is drawn from norm(max(p_j - q_j, 0)) (from p_K,
    the bonus, when every draft is accepted). Returns ``(num_accepted [B], token [B])``: the request
    commits ``draft_ids[b, :num_accepted[b]]`` and then ``token[b]``; the committed tokens are
    distributed as the target's. A one-hot q (a deterministic drafter) makes this the runner's rule:
    accept with probability p(d), otherwise draw from p without d.
    """
    b, k1, v = target_probs.shape
    k = k1 - 1
    p = target_probs.double()
    q = draft_probs.double()
    ids = draft_ids.long()
    if num_drafts is None:
        num_drafts = torch.full((b,), k, dtype=torch.long, device=p.device)
    p_d = p[:, :k].gather(-1, ids[..., None])[..., 0]
    q_d = q.gather(-1, ids[..., None])[..., 0]
    valid = torch.arange(k, device=p.device)[None, :] < num_drafts[:, None]
    # u < p / q without dividing (q(d) == 0: accepted when p(d) > 0, the ratio being infinite)
    ok = (u_accept.double() * q_d < p_d) & valid
    accepted = ok.long().cumprod(-1).sum(-1)  # [B]
    rows = torch.arange(b, device=p.device)
    p_at = p[rows, accepted]  # [B, V]
    at_draft = accepted < num_drafts  # a rejection (not the bonus): the residual of p and q
    q_at = q[rows, accepted.clamp(max=max(k - 1, 0))] if k else torch.zeros_like(p_at)
    residual = torch.where(at_draft[:, None], (p_at - q_at).clamp_(min=0.0), p_at)
    empty = residual.sum(-1, keepdim=True) <= 0  # (only by rounding: a rejection needs p(d) < q(d))
    residual = torch.where(empty, p_at, residual)
    u = u_resample.double().gather(-1, accepted[:, None])[:, 0]
    token = ops.inverse_cdf(residual, u).clamp_(0, v - 1)
    return accepted, token
