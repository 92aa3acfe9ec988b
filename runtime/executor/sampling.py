"""Batched sampling on CPU or GPU: one token per logits row.

Usage (once per step, rows in the order of the logits rows)::

    rng = request_rng(engine_seed, request_id, params.seed)        # once per request; keep it
    batch = SamplingBatch.build(params_list, rngs, histories, device)  # draws the step's uniforms
    out = Sampler().sample(logits, batch)                           # logits: [B, V] on `device`
    out.token_ids       # list[int], one per row
    out.logprobs        # None, or per row None / {sampled_id: lp, top1_id: lp, ...}
    out.nonfinite       # rows whose logits were not finite (their tokens mean nothing)

``histories[i]`` is ``(token_ids, num_prompt_tokens)`` of row i (prompt + output so far, e.g.
``(req.token_ids, req.num_prompt_tokens)``); it is read only for rows that use a penalty, and
``histories`` may be None when no row does.

Semantics (vLLM's)
* penalties first: repetition over prompt + output (logit / r if > 0 else logit · r), then
  frequency (· count) and presence (· [count > 0]) over output tokens only. Greedy rows get them
  too.
* greedy (temperature < 1e-5): argmax of the penalised logits; draws no random number.
* sampled rows: logits / temperature, then min-p (keep p >= min_p · p_max), top-k, top-p (smallest
  set of most likely tokens whose mass reaches top_p, computed after top-k), then one draw. Ties
  at a top-k / top-p boundary are all kept.
* a row whose logits are not finite (NaN, +inf, or all -inf; after penalties and temperature)
  is flagged in ``SampleOutput.nonfinite``; its token is then meaningless, but like every token
  it is a valid id in [0, V): the next step may read it on the device before the host looks.
* logprobs (``SamplingParams.logprobs = N``): the sampled token's logprob and the top-N. With
  ``Sampler(logprobs_mode="raw")`` (the default, as vLLM) they are log_softmax of the logits the
  sampler was given, before penalties and temperature; ``"processed"`` gives log_softmax of the
  penalised logits / temperature (before the top-k/top-p/min-p filters).

Two implementations draw sampled rows, from the same distribution: the torch ops here (a sort per
row for top-p: the reference, and the CPU's) and the sorting-free Triton kernel of
runtime/executor/kernels/sampling.py (CUDA's; ``Sampler(backend=...)`` chooses). Without top-k and
top-p they draw the same token for the same uniform; with them the kernel applies the filters by
rejection, so its tokens differ from the sort's while their distribution is the same.

Randomness: each request owns a CPU ``random.Random`` stream (``request_rng``). Per step a sampled
row draws exactly ONE uniform u from it on the host; the device does filters, weights, float64
cumsum and the inverse CDF with u (the kernel's draws after a rejection use Philox keyed by u).
So a request's token depends only on its logits row and its own stream, never on the batch it
shares (tests check it), and a step costs one small H2D (the packed
parameters and uniforms) and one D2H of the [B] ids (plus logprobs when asked): no per-row
``.item()``. ``SamplingBatch.build`` consumes the uniforms, so build exactly one batch per step.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

import numpy as np
import torch

from runtime.executor import sampling_ops as ops
from runtime.executor.staging import stage
from traces.params import SamplingParams

GREEDY_EPS = 1e-5  # temperatures below this are greedy (as vLLM's _SAMPLING_EPS)

TokenHistory = tuple[Sequence[int], int]  # (prompt + output token ids, number of prompt tokens)

_FIELDS = attrgetter("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                     "frequency_penalty", "presence_penalty")


def request_rng(engine_seed: int, request_id: int, seed: int | None, index: int = 0) -> random.Random:
    """The RNG stream of one request: from its own ``seed`` when given (reproducible across
    engines and batches), else derived from (engine seed, request id). ``index`` tells apart the
    sequences of one request when it asks for several (n > 1)."""
    if seed is not None and index == 0:
        return random.Random(seed)
    key = f"seed/{seed}/{index}" if seed is not None else f"engine/{engine_seed}/{request_id}/{index}"
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
    return random.Random(int.from_bytes(digest, "little"))


@dataclass(frozen=True, slots=True)
class TopKP:
    """Sampled rows that use top-k or top-p (positions in the sampled subset)."""

    rows: torch.Tensor  # [R] int64
    k: torch.Tensor  # [R] int64, 1..V (V = off)
    kmax: int
    p: torch.Tensor | None  # [R] float64, or None when no row uses top-p


@dataclass(frozen=True, slots=True)
class LogprobRows:
    rows: torch.Tensor  # [L] int64 rows of the logits
    temperature: torch.Tensor  # [L] float32 (1 for greedy rows; for "processed" mode)
    host_rows: list[int]
    counts: list[int]  # N per row
    nmax: int


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Per-step sampling inputs, already on the device. Build with ``SamplingBatch.build``."""

    num_rows: int
    device: torch.device
    sample_rows: torch.Tensor | None  # [S] int64 rows that sample; None when all rows sample
    num_sampled: int
    temperature: torch.Tensor  # [S] float32
    uniforms: torch.Tensor  # [S] float64
    min_p: torch.Tensor | None  # [S] float32, None when no row uses it
    top_kp: TopKP | None
    filters: torch.Tensor  # [3, S] float64: min_p (0 = off), top_k (vocab_size or more = off), top_p (1 = off)
    penalties: ops.PenaltyTensors | None
    logprobs: LogprobRows | None
    h2d_bytes: int  # size of the step's one host-to-device copy

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        rngs: Sequence[random.Random | None],
        histories: Sequence[TokenHistory | None] | None = None,
        device: torch.device | str = "cpu",
        vocab_size: int | None = None,
    ) -> SamplingBatch:
        """Host side of a step: parameter arrays built with numpy, one uniform drawn per sampled
        row from ``rngs[i]`` (None is allowed for greedy rows), one H2D copy.

        ``vocab_size`` bounds top_k (defaults to no bound; the sampler clamps to V anyway).
        """
        device = torch.device(device)
        b = len(params)
        if len(rngs) != b:
            raise ValueError(f"{len(rngs)} rngs for {b} rows")
        temp, top_p, top_k, min_p, rep, freq, pres = _param_table(params).T
        sampled = temp >= GREEDY_EPS
        srows = np.flatnonzero(sampled)
        s = srows.size
        try:
            uniforms = [rngs[i].random() for i in srows.tolist()]
        except AttributeError:
            bad = next(i for i in srows.tolist() if rngs[i] is None)
            raise ValueError(f"row {bad} samples (temperature > 0) but its rng is None") from None
        host: dict[str, np.ndarray] = {
            "temperature": temp[srows].astype(np.float32),
            "uniforms": np.array(uniforms, dtype=np.float64),
        }
        if s < b:
            host["sample_rows"] = srows.astype(np.int64)
        if (min_p[srows] > 0).any():
            host["min_p"] = min_p[srows].astype(np.float32)
        # the kernel's: every filter of every sampled row in one array, so it has one specialisation
        host["filters"] = np.stack([min_p[srows], np.where(top_k[srows] > 0, top_k[srows], np.inf),
                                    top_p[srows]]).reshape(-1)
        # top-k / top-p rows, as positions within the sampled subset
        k_s, p_s = top_k[srows], top_p[srows]
        kp_pos = np.flatnonzero((k_s > 0) | (p_s < 1))
        if kp_pos.size:
            off = np.iinfo(np.int32).max if vocab_size is None else vocab_size
            host["kp_rows"] = kp_pos.astype(np.int64)
            host["kp_k"] = np.where(k_s[kp_pos] > 0, np.minimum(k_s[kp_pos], off), off).astype(np.int64)
            if (p_s[kp_pos] < 1).any():
                host["kp_p"] = p_s[kp_pos]

        pen_rows = np.flatnonzero((rep != 1) | (freq != 0) | (pres != 0))
        if pen_rows.size:
            host.update(_penalty_arrays(pen_rows, rep, freq, pres, histories))
        lp_counts = [p.logprobs for p in params]
        lp_rows = [i for i, n in enumerate(lp_counts) if n is not None]
        if lp_rows:
            host["lp_rows"] = np.array(lp_rows, dtype=np.int64)
            host["lp_temperature"] = np.where(sampled, temp, 1.0)[lp_rows].astype(np.float32)

        dev, h2d_bytes = stage(host, device)
        top_kp = None
        if kp_pos.size:
            top_kp = TopKP(dev["kp_rows"], dev["kp_k"], int(host["kp_k"].max()), dev.get("kp_p"))
        penalties = None
        if pen_rows.size:
            penalties = ops.PenaltyTensors(
                **{f: dev["pen_" + f] for f in _PENALTY_TENSORS},
                any_repetition=bool((rep[pen_rows] != 1).any()))
        logprobs = None
        if lp_rows:
            counts = [lp_counts[i] for i in lp_rows]
            logprobs = LogprobRows(dev["lp_rows"], dev["lp_temperature"], lp_rows, counts, max(counts))
        return cls(b, device, dev.get("sample_rows"), s, dev["temperature"], dev["uniforms"],
                   dev.get("min_p"), top_kp, dev["filters"].view(3, s), penalties, logprobs, h2d_bytes)

    @classmethod
    def greedy(cls, num_rows: int, device: torch.device | str) -> SamplingBatch:
        """The batch of ``num_rows`` plain greedy rows (see ``plain_greedy``): nothing to send."""
        empty = torch.zeros(0, device=device)
        return cls(num_rows, torch.device(device), None, 0, empty, empty, None, None, empty.view(3, 0).double(), None,
                   None, 0)

    @property
    def all_greedy(self) -> bool:
        return self.num_sampled == 0


def plain_greedy(params: Sequence[SamplingParams]) -> bool:
    """Every row is greedy without penalties or logprobs: its batch is ``SamplingBatch.greedy``."""
    return all(p.temperature < GREEDY_EPS and p.logprobs is None and p.repetition_penalty == 1.0
               and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0 for p in params)


def _param_table(params: Sequence[SamplingParams]) -> np.ndarray:
    """[B, 7] float64: the _FIELDS of every row."""
    b = len(params)
    if b and all(p is params[0] for p in params):  # one shared params object: the common case
        return np.tile(np.array(_FIELDS(params[0]), dtype=np.float64), (b, 1))
    return np.fromiter(chain.from_iterable(map(_FIELDS, params)), np.float64, 7 * b).reshape(b, 7)


_PENALTY_TENSORS = ("rows", "repetition", "frequency", "presence", "out_rows", "out_tokens",
                    "prompt_rows", "prompt_tokens")


def _penalty_arrays(rows: np.ndarray, rep: np.ndarray, freq: np.ndarray, pres: np.ndarray,
                    histories: Sequence[TokenHistory | None] | None) -> dict[str, np.ndarray]:
    """Penalty parameters and flattened (row, token) pairs of the output and prompt tokens of
    the rows with penalties. O(history) per step for those rows only.
    """
    outs, prompts = [], []
    for i in rows.tolist():
        h = histories[i] if histories is not None else None
        if h is None:
            raise ValueError(f"row {i} uses a penalty but has no token history")
        ids = np.asarray(h[0]).astype(np.int64)
        outs.append(ids[h[1]:])
        prompts.append(ids[:h[1]] if rep[i] != 1 else ids[:0])
    r = np.arange(len(outs), dtype=np.int64)
    arrays = [
        rows.astype(np.int64),
        rep[rows].astype(np.float32), freq[rows].astype(np.float32), pres[rows].astype(np.float32),
        np.repeat(r, [len(o) for o in outs]), np.concatenate(outs),
        np.repeat(r, [len(p) for p in prompts]), np.concatenate(prompts),
    ]
    return {"pen_" + name: a for name, a in zip(_PENALTY_TENSORS, arrays)}


@dataclass(frozen=True, slots=True)
class SampleOutput:
    token_ids: list[int]
    # None when no row asked for logprobs; else per row None or {sampled: lp, top-N...}
    # (sampled token first, then the top-N in rank order; a token appears once)
    logprobs: list[dict[int, float] | None] | None = None
    nonfinite: tuple[int, ...] = ()  # rows whose logits were NaN or infinite


class Sampler:
    """Stateless apart from configuration; see the module docstring for semantics. ``backend``:
    who draws the sampled rows: "torch", "triton" (on the CPU too, under TRITON_INTERPRET=1) or
    "auto" (the kernel on CUDA: on the H200 top-p over 256 rows of 151,936 logits takes it 0.3 ms
    against the torch sort's 5.2; torch on the CPU; docs/BENCHMARKS.md)."""

    def __init__(self, logprobs_mode: str = "raw", backend: str = "auto") -> None:
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
        self.logprobs_mode = logprobs_mode
        self.backend = backend

    def _kernel(self, logits: torch.Tensor) -> bool:
        return self.backend == "triton" or (self.backend == "auto" and logits.is_cuda)

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> SampleOutput:
        """``logits`` [B, V] (any float dtype) on ``batch.device``; never modified."""
        return self.sample_async(logits, batch).result()

    @torch.inference_mode()
    def sample_async(self, logits: torch.Tensor, batch: SamplingBatch) -> PendingSample:
        """Queue the sampling on the device and the copy of its results to the host; the ids are
        usable on the device at once (``device_ids``), on the host after ``result()``."""
        if logits.dim() != 2 or logits.shape[0] != batch.num_rows:
            raise ValueError(f"logits {tuple(logits.shape)} do not match a batch of {batch.num_rows} rows")
        if batch.num_rows == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=logits.device)
            return PendingSample(empty, empty.bool())
        processed = logits if batch.penalties is None else ops.apply_penalties(logits, batch.penalties)
        ids, bad = self._draw(processed, batch)
        ids = ids.clamp_(0, logits.shape[1] - 1)  # whatever the row held: an id the embedding can look up
        if batch.logprobs is None:
            return PendingSample(ids, bad)
        source = logits if self.logprobs_mode == "raw" else processed
        return PendingSample(ids, bad, *self._logprob_tensors(source, ids, bad, batch.logprobs))

    def _draw(self, logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """[B] ids and [B] bool: the rows whose logits were not finite."""
        if batch.all_greedy:
            return ops.checked_argmax(logits)
        rows = batch.sample_rows
        if self._kernel(logits):
            from runtime.executor.kernels.sampling import sample_rows  # (Triton: imported when used)

            drawn, bad = sample_rows(logits, rows, batch.temperature, batch.uniforms, batch.filters)
            return self._with_greedy(logits, rows, drawn, bad)
        x = logits if rows is None else logits.index_select(0, rows)
        # float32 by type promotion (one kernel for bf16 logits); a new tensor: safe to modify
        x = x / batch.temperature[:, None]
        top = x.amax(-1, keepdim=True)  # NaN if the row holds one; inf or -inf past float32's range
        bad = ~torch.isfinite(top[:, 0])
        w = x.sub_(top).exp_()  # best token weighs exactly 1
        thr = batch.min_p
        kp = batch.top_kp
        if kp is not None:
            sub = w.index_select(0, kp.rows)
            floor = thr.index_select(0, kp.rows) if thr is not None else torch.zeros_like(sub[:, 0])
            new = ops.top_k_top_p_threshold(sub, floor, kp.k, kp.kmax, kp.p)
            thr = (thr.clone() if thr is not None else torch.zeros_like(w[:, 0])).index_copy_(0, kp.rows, new)
        if thr is not None:
            w.masked_fill_(w < thr[:, None], 0.0)
        return self._with_greedy(logits, rows, ops.inverse_cdf(w, batch.uniforms), bad)

    @staticmethod
    def _with_greedy(logits: torch.Tensor, rows: torch.Tensor | None, drawn: torch.Tensor,
                     bad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampled rows' draws among the greedy rows' argmax (``rows`` None: every row sampled)."""
        if rows is None:
            return drawn, bad
        ids, bad_all = ops.checked_argmax(logits)
        return ids.index_copy_(0, rows, drawn), bad_all.index_copy_(0, rows, bad | bad_all.index_select(0, rows))

    def _logprob_tensors(self, source: torch.Tensor, ids: torch.Tensor, bad: torch.Tensor,
                         lp: LogprobRows) -> tuple[torch.Tensor, LogprobRows, int]:
        """One float64 tensor: ids (flagged), chosen logprobs, top-N values, top-N ids (for one D2H copy)."""
        x = source.index_select(0, lp.rows).float()
        if self.logprobs_mode == "processed":
            x = x / lp.temperature[:, None]
        logp = torch.log_softmax(x, -1)
        n = min(lp.nmax, logp.shape[1])
        chosen = logp.gather(1, ids.index_select(0, lp.rows)[:, None])
        parts = [flag_rows(ids, bad).double(), chosen.double().reshape(-1)]
        if n:
            top = torch.topk(logp, n, dim=-1)
            parts += [top.values.double().reshape(-1), top.indices.double().reshape(-1)]
        return torch.cat(parts), lp, n


def flag_rows(ids: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """The ids with the non-finite rows' written as -1 - id: the flags travel in the ids' copy."""
    return torch.where(bad, -1 - ids, ids)


def _unflag(ids: np.ndarray) -> tuple[list[int], tuple[int, ...]]:
    """``flag_rows`` undone on the host: (ids, flagged rows)."""
    if ids.min(initial=0) >= 0:  # the common case: one pass
        return ids.tolist(), ()
    flagged = np.flatnonzero(ids < 0)
    return np.where(ids < 0, -1 - ids, ids).tolist(), tuple(flagged.tolist())


class PendingSample:
    """A step's sampled ids (and logprobs) on their way to the host: one non-blocking D2H into
    pinned memory, waited for by ``result()``, so the host can plan the next step meanwhile."""

    def __init__(self, device_ids: torch.Tensor, bad: torch.Tensor, payload: torch.Tensor | None = None,
                 logprobs: LogprobRows | None = None, num_top: int = 0) -> None:
        self.device_ids = device_ids  # always valid ids: the next step's placeholders read them
        self._logprobs, self._num_top = logprobs, num_top
        payload = flag_rows(device_ids, bad) if payload is None else payload
        self._event = None
        if payload.is_cuda:
            self._host = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
            self._host.copy_(payload, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = payload

    def result(self) -> SampleOutput:
        if self._event is not None:
            self._event.synchronize()
        host = self._host.numpy()
        lp = self._logprobs
        if lp is None:
            token_ids, nonfinite = _unflag(host)
            return SampleOutput(token_ids, None, nonfinite)
        b, nrows, n = self.device_ids.shape[0], len(lp.host_rows), self._num_top
        token_ids, nonfinite = _unflag(host[:b].astype(np.int64))
        chosen = host[b:b + nrows].tolist()
        top_vals = host[b + nrows:b + nrows + nrows * n].reshape(nrows, n).tolist()
        top_ids = host[b + nrows + nrows * n:].astype(np.int64).reshape(nrows, n).tolist()
        out: list[dict[int, float] | None] = [None] * b
        for j, row in enumerate(lp.host_rows):
            d = {token_ids[row]: chosen[j]}
            for tid, val in zip(top_ids[j][:lp.counts[j]], top_vals[j][:lp.counts[j]]):
                d.setdefault(tid, val)
            out[row] = d
        return SampleOutput(token_ids, out, nonfinite)
