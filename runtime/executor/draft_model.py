"""The draft-model drafter (``--speculative model:PATH:K``): a small model's greedy continuation.

The draft model is loaded by the target's loader (an HF folder, a .gguf, ``random:<shape>``) on
the target's device and dtype, and must share its tokenizer (``load_draft``: a clear ConfigError
otherwise). It keeps a KV pool of its own, accounted by a BlockManager of its own (no prefix
caching, no log: its decisions are not the engine's), and remembers per request which tokens its KV
holds: the request's tokens up to where it last proposed, then the drafts it fed itself.

``propose`` runs once per step, before the step is budgeted, batched over the step's decoding
requests: a catch-up forward over the tokens each request's draft KV lacks (the tokens committed
since it last proposed, less the drafts they repeat; the whole prompt the first time), whose last
logits give the first draft, then K - 1 one-token steps, each feeding the drafts of the previous
one (read on the device: one copy to the host at the end). A request asking for fewer drafts leaves
the batch after its last. Greedy drafts are deterministic, so the target's one-hot acceptance
(runtime/executor/speculative.py) is exact.

Requests whose status is done are forgotten at the next ``propose``; when the pool runs out, the
least recently drafted requests outside the step lose their draft KV (they catch up again later),
and a request that still does not fit gets no drafts this step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from runtime.engine.block_manager import BlockManager
from runtime.engine.config import ConfigError
from runtime.engine.drafters import SpeculativeSpec
from runtime.engine.request import Request
from runtime.engine.types import StepPlan
from runtime.executor.attention import get_backend
from runtime.executor.cuda_graphs import DecodeGraphs
from runtime.executor.kv_cache import allocate_kv, block_bytes
from runtime.executor.model.loader import LoadedModel, load_model
from runtime.executor.model_inputs import HostInputs, host_inputs, to_device
from runtime.executor.sampling_ops import row_argmax
from traces.events import Span


def load_draft(spec: SpeculativeSpec, target: LoadedModel, max_model_len: int, seed: int = 0) -> LoadedModel:
    """The draft model of ``spec`` (``model:PATH:K``) on the target's device and dtype; ConfigError
    when it can't draft for ``target``: another tokenizer, another vocabulary, too few positions."""
    try:
        draft = load_model(spec.arg, device=target.device, dtype=target.dtype, seed=seed)
    except (ValueError, OSError) as e:
        raise ConfigError(f"speculative {spec}: the draft model does not load: {e}") from None
    check_compatible(spec, draft, target, max_model_len)
    return draft


def check_compatible(spec: SpeculativeSpec, draft: LoadedModel, target: LoadedModel, max_model_len: int) -> None:
    where = f"speculative {spec}: the draft model {draft.path}"
    if draft.tokenizer is not None and target.tokenizer is not None:
        if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
            raise ConfigError(f"{where} has another tokenizer than the target {target.path}: its token ids "
                              "mean other text")
    elif draft.spec.vocab_size != target.spec.vocab_size:
        raise ConfigError(f"{where} has a vocabulary of {draft.spec.vocab_size} tokens, the target "
                          f"{target.path} of {target.spec.vocab_size} (and no pair of tokenizers to compare)")
    if draft.model.rotary.max_positions < max_model_len:
        raise ConfigError(f"{where} has {draft.model.rotary.max_positions} positions, fewer than "
                          f"scheduler.max_model_len {max_model_len}")


def draft_pool_blocks(num_blocks: int, block_size: int, max_num_seqs: int, num_tokens: int) -> int:
    """The draft's KV pool: the target's block count (the same tokens, without prefix sharing) and
    room for every running request's K - 1 fed drafts past its tokens."""
    return num_blocks + max_num_seqs * -(-num_tokens // block_size)


def draft_block_bytes(draft: LoadedModel, block_size: int) -> int:
    return block_bytes(draft.spec, draft.dtype, block_size)


class _Seq:
    """What the draft's KV holds of one request: its first ``real`` tokens, then ``fed``."""

    __slots__ = ("request", "request_id", "real", "fed", "used")

    def __init__(self, request: Request) -> None:
        self.request, self.request_id = request, request.request_id
        self.real, self.fed, self.used = 0, [], 0

    def computed(self, tokens) -> int:
        """Leading positions of ``tokens`` whose KV the draft holds."""
        n = self.real
        for i, d in enumerate(self.fed, n):
            if i >= len(tokens) or tokens[i] != d:
                break
            n += 1
        return n


class DraftModelDrafter:
    """See the module docstring. ``vocab_size``: the target's (drafts are ids it knows)."""

    name = "model"

    def __init__(self, loaded: LoadedModel, spec: SpeculativeSpec, *, block_size: int, num_blocks: int,
                 max_model_len: int, max_num_seqs: int, vocab_size: int, attention_backend: str = "auto",
                 enforce_eager: bool = False) -> None:
        self.loaded, self.spec, self.model = loaded, spec, loaded.model
        self.num_tokens = spec.num_tokens
        self.device = loaded.device
        self.block_size, self.num_blocks = block_size, num_blocks
        self.vocab_size = min(vocab_size, loaded.spec.vocab_size)
        self.backend = get_backend(attention_backend, self.device)
        self.kv_caches = allocate_kv(loaded.spec, num_blocks, block_size, loaded.dtype, self.device)
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self._seqs: dict[int, _Seq] = {}
        self._round = 0
        self.graphs: DecodeGraphs | None = None  # its one-token steps, on CUDA with Triton
        if self.device.type == "cuda" and self.backend.name == "triton" and not enforce_eager:
            self.graphs = DecodeGraphs(self.model, self.kv_caches, self.backend, max_batch=max_num_seqs,
                                       max_model_len=max_model_len, block_size=block_size, device=self.device)
            self.graphs.capture()
        self.stats = {"rounds": 0, "forwards": 0, "catch_up_tokens": 0, "evicted": 0, "unfit": 0}

    def reset(self) -> None:
        """Forget every request (a new engine core's ids start again from 0)."""
        self._seqs.clear()
        self.bm = BlockManager(self.num_blocks, self.block_size, enable_prefix_caching=False)

    # --- KV ------------------------------------------------------------------------------------

    def _drop(self, seq: _Seq) -> None:
        self.bm.free(seq)
        self._seqs.pop(seq.request_id, None)

    def _fit(self, seq: _Seq, num_tokens: int, keep: set[int]) -> bool:
        """Blocks for positions [0, num_tokens) of ``seq``, evicting the least recently drafted
        requests outside ``keep`` while they don't fit."""
        bm = self.bm
        bm.trim(seq, num_tokens)
        if bm.allocate(seq, num_tokens):
            return True
        for other in sorted((s for s in self._seqs.values() if s.request_id not in keep), key=lambda s: s.used):
            self._drop(other)
            self.stats["evicted"] += 1
            if bm.allocate(seq, num_tokens):
                return True
        return False

    # --- proposing -------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        self._round += 1
        for seq in [s for s in self._seqs.values() if s.request.status.done]:
            self._drop(seq)
        out: list[list[int]] = [[] for _ in requests]
        work: list[tuple[int, _Seq, int, int, int]] = []  # (index, seq, computed, tokens, limit)
        keep = {r.request_id for r, n in zip(requests, limits) if n > 0}
        for i in sorted(range(len(requests)), key=lambda i: -limits[i]):  # longest first: each step a prefix
            req, limit = requests[i], limits[i]
            if limit <= 0:
                break
            seq = self._seqs.get(req.request_id)
            if seq is None or seq.request is not req:  # new, or an id an earlier core handed out
                if seq is not None:
                    self._drop(seq)
                seq = self._seqs[req.request_id] = _Seq(req)
            tokens = req.token_ids
            n = len(tokens)
            computed = min(seq.computed(tokens), n - 1)  # the last token's logits give the first draft
            if not self._fit(seq, n + limit - 1, keep):
                self._drop(seq)
                self.stats["unfit"] += 1
                continue
            seq.used = self._round
            work.append((i, seq, computed, n, limit))
        self.bm.drain_events()
        if not work:
            return out
        ids = self._draft(work)
        for i, seq, _, n, limit in work:
            drafts = ids[i]
            seq.real, seq.fed = n, drafts[: limit - 1]
            out[i] = drafts
        self.stats["rounds"] += 1
        return out

    def _draft(self, work: list[tuple[int, _Seq, int, int, int]]) -> dict[int, list[int]]:
        """Greedy drafts of every request of ``work`` (limits non-increasing): index -> its drafts."""
        bm, bs = self.bm, self.block_size
        spans = [Span(seq.request_id, computed, n - computed, True) for _, seq, computed, n, _ in work]
        plan = StepPlan(0, spans, [bm.tables[s.request_id] for s in spans], [], [],
                        sum(s.num_tokens for s in spans), len(spans))
        catch_up = host_inputs(plan, {seq.request_id: seq.request for _, seq, _, _, _ in work}, bs)
        self.stats["catch_up_tokens"] += catch_up.num_tokens
        steps = [self._greedy(catch_up, None)]
        lengths = np.array([n for _, _, _, n, _ in work], np.int64)
        tables = [bm.tables[seq.request_id] for _, seq, _, _, _ in work]
        batch = len(work)
        for i in range(1, work[0][4]):
            while work[batch - 1][4] <= i:
                batch -= 1
            steps.append(self._greedy(self._decode_inputs(lengths[:batch] + (i - 1), tables[:batch]), steps[-1]))
        host = torch.cat(steps).tolist()  # the one wait for the device
        out: dict[int, list[int]] = {}
        offsets = np.cumsum([0] + [len(s) for s in steps]).tolist()
        for j, (index, _, _, _, limit) in enumerate(work):
            out[index] = [host[offsets[i] + j] for i in range(limit)]
        return out

    def _greedy(self, host: HostInputs, previous: torch.Tensor | None) -> torch.Tensor:
        """One forward of the draft; its argmax per sampled row (device ids)."""
        self.stats["forwards"] += 1
        if self.graphs is not None and self.graphs.supports(host):
            logits = self.graphs.run(host, previous)
        else:
            inputs = to_device(host, self.device, previous)
            logits = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.backend,
                                inputs.logits_indices)
        if logits.shape[1] > self.vocab_size:
            logits = logits[:, : self.vocab_size]
        return row_argmax(logits).to(torch.int64).clamp_(0, self.vocab_size - 1)

    def _decode_inputs(self, positions: np.ndarray, tables: list[list[int]]) -> HostInputs:
        """A one-token step of ``len(positions)`` requests at ``positions``, each reading its input,
        the draft before it, from the previous step's ids (row i from row i)."""
        b, bs = len(positions), self.block_size
        width = max(map(len, tables))
        table = np.zeros((b, width), np.int32)
        for i, t in enumerate(tables):
            table[i, : len(t)] = t
        slots = table[np.arange(b), positions // bs].astype(np.int64) * bs + positions % bs
        rows = np.arange(b, dtype=np.int64)
        return HostInputs(input_ids=np.full(b, -1, np.int64), positions=positions.astype(np.int64),
                          slot_mapping=slots, query_start=np.arange(b + 1, dtype=np.int64),
                          seq_lens=(positions + 1).astype(np.int32), block_table=table, logits_indices=rows,
                          num_decodes=b, sampled_requests=[], fill_rows=rows, fill_from=rows)


def build_draft_drafter(spec: SpeculativeSpec, target: LoadedModel, *, block_size: int, num_blocks: int,
                        max_model_len: int, max_num_seqs: int, attention_backend: str = "auto",
                        enforce_eager: bool = False, seed: int = 0,
                        draft: LoadedModel | None = None) -> DraftModelDrafter:
    """The drafter of ``model:PATH:K`` for ``target`` (``draft``: already loaded by ``load_draft``);
    its pool holds ``draft_pool_blocks`` of the target's ``num_blocks``."""
    if draft is None:
        draft = load_draft(spec, target, max_model_len, seed)
    pool = draft_pool_blocks(num_blocks, block_size, max_num_seqs, spec.num_tokens)
    return DraftModelDrafter(draft, spec, block_size=block_size, num_blocks=pool, max_model_len=max_model_len,
                             max_num_seqs=max_num_seqs, vocab_size=target.spec.vocab_size,
                             attention_backend=attention_backend, enforce_eager=enforce_eager)
