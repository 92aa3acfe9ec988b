"""What ``minivllm profile`` runs: a list of small workloads ("cases"), each shaped so the engine's
own scheduler produces the step shapes the cost model needs (simulator/cost/features.py):

  PrefillCase(chunk, context=0)   one prompt of ``chunk`` new tokens per step: pure prefill
  PrefillCase(chunk, context>0)   the same on ``context`` tokens the prefix cache already holds
                                  (a shared prefix): Σ chunk × context
  PrefillCase(chunk > budget)     a whole prompt longer than the live budget in one step: what a
                                  chunked-off what-if runs (up to ``max_prefill``, default
                                  max_model_len; the profiled engine's budget is raised to it), at
                                  1.3, 1.6 and 2 times each power-of-two multiple of the budget, so
                                  that the piecewise graphs pad them by many amounts (the padded
                                  token's cost rests on more than a couple of steps)
  DecodeCase(batch, context)      ``batch`` prompts of ``context`` tokens; while they prefill, the
                                  early ones decode (mixed steps); then ``steps`` pure decode
                                  steps; then one fresh prompt per ``mixed_chunks`` entry joins
                                  the running batch (decode + prefill in one step), unless the
                                  batch already holds max_num_seqs sequences; contexts a factor of
                                  4 apart, 1.5, 1.875 and 2 for batches up to SMALL_BATCH (single
                                  streams and speculation, whose step time a model interpolates
                                  between them; 1.875: where the decode kernel's programs are longest)
  DecodeCase(..., mixed_context=p) the injected prompts start with a cached prefix of ``p`` tokens:
                                  a prompt's chunk on its context beside the decodes, as a long
                                  prompt's later chunks run when chunked prefill serves it (such a
                                  step costs less than a prefill step and a decode step added up)
  DecodeCase(..., spread=True)    the same with contexts as unequal as a served batch's: one request
                                  at ``context``, the rest spread from 1/8 to 3/4 of it (a served
                                  batch's longest context is 1.4-3.7 times its mean): the decode
                                  kernel's longest program apart from the batch's whole context,
                                  which equal contexts always tie together
  DecodeCase(..., shared=True)    the same with one shared prefix (computed once, then prefix-cache
                                  hits): decode batch × context up to the KV pool without paying
                                  for batch × context tokens of prefill
  DecodeCase(..., drafts=d)       speculative verification: every decode step verifies ``d``
                                  drafts per request (spans of 1 + d tokens over the context; the
                                  sweep's drafter proposes them, and almost all are rejected, so
                                  a step commits about one token); a verify span's rows cost what
                                  a short GEMM costs, which no prefill chunk shows

No torch here: the plan is plain data, so a test can run the full GPU-sized sweep through the
engine core with a zero-cost executor and count its steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.engine.config import EngineConfig


@dataclass(frozen=True)
class PrefillCase:
    chunk: int
    context: int = 0
    repeats: int = 1

    @property
    def kind(self) -> str:
        return "prefill+context" if self.context else "prefill"


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    context: int
    steps: int
    mixed_chunks: tuple[int, ...] = ()
    shared: bool = False  # prompts share all but their last block: cheap to prefill, full context to decode
    drafts: int = 0  # drafts each decode step verifies per request (0: plain decode)
    spread: bool = False  # contexts unequal: one at ``context``, the rest from 1/8 to 3/4 of it
    mixed_context: int = 0  # the injected prompts' cached prefix (0: fresh prompts)

    @property
    def kind(self) -> str:
        if self.drafts:
            return "verify"
        if self.spread:
            return "decode (unequal contexts)"
        if self.mixed_context:
            return "decode + prefill on a prefix"
        return "decode (shared prefix)" if self.shared else "decode"

    @property
    def contexts(self) -> list[int]:
        """Each request's prompt: ``context`` tokens, or with ``spread`` one at ``context`` (the
        longest) and the others evenly from 1/8 to 3/4 of it."""
        if not self.spread or self.batch == 1:
            return [self.context] * self.batch
        lo, hi, rest = self.context / 8, self.context * 3 / 4, self.batch - 1
        return [self.context] + [max(1, round(lo + (hi - lo) * i / max(rest - 1, 1))) for i in range(rest)]


Case = PrefillCase | DecodeCase


@dataclass(frozen=True)
class SweepLimits:
    max_context: int  # longest prompt (or prefix + chunk) a case builds
    max_batch: int  # most sequences decoding together
    budget: int  # the engine's max_num_batched_tokens: no chunk is planned larger
    block_size: int  # prefix contexts are whole blocks, so the prefix cache covers them exactly
    max_kv_tokens: int  # batch × context cap of a decode case (prefill cost, KV pool)
    max_prefill: int = 0  # longest whole prompt profiled in one step (> budget: chunked-off what-ifs)
    pool_tokens: int = 0  # the KV pool: shared-prefix decode cases reach up to it
    fill_pool: bool = False  # decode cases prefill up to the pool (a GPU): a finer context grid for every batch


# Drafts per verify span the sweep measures (at most MAX_SPECULATIVE_TOKENS, runtime/engine/drafters.py)
VERIFY_DRAFTS = (1, 2, 4, 8, 16)
VERIFY_MAX_BATCH = 32
SMALL_BATCH = 8  # decode batches up to this size are profiled on a finer context grid
SPREAD_MIN_BATCH, SPREAD_MIN_CONTEXT = 4, 512  # decode batches also profiled with unequal contexts
MIXED_PREFIX_BATCHES = (1, 4, 16, 64)  # decode batches a prompt's chunk on a cached prefix joins


def verify_steps(batch: int) -> int:
    """Verify steps a case measures: more from batch 4 on, where a step's rows (batch × (1 + drafts))
    reach the sizes at which GEMM and graph costs step, and a few samples a shape leave the fit noisy."""
    return 6 if batch < 4 else 12


# Context a decode case's requests may grow by: decoding while the rest of the batch prefills
# (batch × context / budget steps at most), then ``steps`` and the mixed injections.
DECODE_HEADROOM = 512


def longest_request(config: EngineConfig) -> int:
    """Prompt + output tokens one request may hold: within max_model_len and the KV pool, and with
    chunked prefill off within the budget."""
    sched, cache = config.scheduler, config.cache
    longest = min(sched.max_model_len, cache.num_blocks * cache.block_size)
    return longest if sched.enable_chunked_prefill else min(longest, sched.max_num_batched_tokens)


POOL_SHARE = 0.9  # of the KV pool a decode case may fill


def derive_limits(max_context: int, max_batch: int, config: EngineConfig, *, budget: int | None = None,
                  max_prefill: int | None = None, fill_pool: bool = False) -> SweepLimits:
    """Limits for an engine built with ``config``: contexts leave decode headroom below the
    longest request it takes, batches fit ``max_num_seqs``.
    ``budget``: the live engine's step budget the chunk ladder stops at (default: ``config``'s);
    ``max_prefill``: whole prompts up to this many tokens (``config``'s budget must hold them).
    A decode case first prefills its batch × context tokens: with ``fill_pool`` (a GPU, which
    prefills a pool in seconds) decode batches go up to POOL_SHARE of the KV pool, where a busy
    server decodes; else (the CPU's minutes) to a quarter of max_batch × max_context and half the
    pool, and shared-prefix cases go beyond."""
    sched, cache = config.scheduler, config.cache
    max_len = longest_request(config)
    max_context = min(max_context, max_len - min(DECODE_HEADROOM, max_len // 4))
    max_batch = min(max_batch, sched.max_num_seqs)
    pool_tokens = cache.num_blocks * cache.block_size
    budget = min(budget or sched.max_num_batched_tokens, sched.max_num_batched_tokens)
    max_prefill = min(max_prefill or budget, sched.max_num_batched_tokens, max_len - 1)
    if fill_pool:
        max_kv_tokens = min(max_batch * max_context, int(POOL_SHARE * pool_tokens))
    else:
        max_kv_tokens = min(max_batch * max_context // 4, pool_tokens // 2)
    return SweepLimits(max_context=max_context, max_batch=max_batch, budget=budget,
                       block_size=cache.block_size, max_kv_tokens=max(max_context, max_kv_tokens),
                       max_prefill=max(max_prefill, 0), pool_tokens=pool_tokens, fill_pool=fill_pool)


def _geometric(lo: int, hi: int, factor: int) -> list[int]:
    out, x = [], lo
    while x <= hi:
        out.append(x)
        x *= factor
    return out


def _with_top(values: list[int], top: int) -> list[int]:
    return sorted({v for v in values if v <= top} | {top})


def _interleave(*groups: list[Case]) -> list[Case]:
    """Round-robin by progress through each group (small cases first within each), so a sweep cut
    short by a time limit still covers every shape class."""
    keyed = [((i + 0.5) / len(g), gi, case) for gi, g in enumerate(groups) for i, case in enumerate(g)]
    return [case for _, _, case in sorted(keyed, key=lambda k: (k[0], k[1]))]


def sweep_plan(limits: SweepLimits, *, quick: bool = False) -> list[Case]:
    """The measured sweep. ``quick``: a few cases of each class (CI, tests)."""
    lim = limits
    top_chunk = min(lim.budget, lim.max_context)
    bs = lim.block_size
    if quick:
        chunks, repeats, ctx_chunks = _with_top([16, 64], top_chunk), 1, [16, 64]
        contexts = [max(bs, lim.max_context // 2 // bs * bs)]
        batches, decode_ctx, steps = _with_top([1], lim.max_batch), _with_top([32], lim.max_context), 3
        small_ctx = small_decode_ctx = decode_ctx
    else:
        chunks, repeats, ctx_chunks = _with_top(_geometric(16, top_chunk, 2), top_chunk), 3, [16, 128, 512, 2048]
        contexts = _geometric(256, lim.max_context - 16, 4) + [lim.max_context // 2, lim.max_context - 256]
        contexts = sorted({c // bs * bs for c in contexts if c >= 256})
        # powers of two, and 3, 6, 12 between them: step cost is not linear in the batch (GEMMs padded to
        # a tile, CUDA graphs captured for bucketed sizes), and live batches are mostly small
        between = {b for b in (3, 6, 12) if b <= lim.max_batch}
        batches = _with_top(sorted(set(_geometric(1, lim.max_batch, 2)) | between), lim.max_batch)
        # small batches (single streams, speculation) at every power of two: their step cost grows with
        # the context by the decode kernel's programs, which a model can only interpolate between points;
        # larger ones too where their prefill is cheap (a GPU), else a factor of 4 apart
        small_ctx = _with_top(_geometric(32, lim.max_context, 2), lim.max_context)
        decode_ctx = small_ctx if lim.fill_pool else _with_top(_geometric(32, lim.max_context, 4), lim.max_context)
        steps = 16
        # ... and their decodes at 1.5 times each too (trees do not interpolate: a split between two
        # points prices half the range between them as the far one), inside the longest context
        # and at 15/8 (just short of the next power of two, where the decode kernel's programs are longest:
        # a served single stream's context falls anywhere in an octave)
        small_decode_ctx = sorted(set(small_ctx) | {c * f // 8 for c in small_ctx for f in (12, 15)
                                                    if c * f // 8 < lim.max_context})

    prefill = [PrefillCase(c, 0, repeats) for c in chunks]
    if lim.max_prefill > lim.budget:  # whole prompts beyond the live budget (chunked-off what-ifs)
        sizes = {int(x * f) for x in _geometric(top_chunk, lim.max_prefill, 2) for f in (1.3, 1.6, 2)}
        longer = [lim.max_prefill] if quick else _with_top(sorted(sizes), lim.max_prefill)
        prefill += [PrefillCase(c, 0, min(repeats, 2)) for c in longer if c > top_chunk]
    on_context = [PrefillCase(c, ctx, max(1, repeats - 1)) for ctx in contexts for c in ctx_chunks
                  if 2 <= c <= min(lim.budget, lim.max_context - ctx)]
    decode = []
    for b in batches:
        grid = small_decode_ctx if b <= SMALL_BATCH else decode_ctx
        contexts_b = [ctx for ctx in grid if b * ctx <= lim.max_kv_tokens]
        for ctx in contexts_b:
            fill = min(lim.budget - b, lim.max_context)  # a chunk that fills the step's budget
            # the budget-filling chunk (the costliest step) once per batch size, at its longest context
            mixed = sorted({c for c in (16, 256) if c < fill} | ({fill} if ctx == contexts_b[-1] else set()))
            decode.append(DecodeCase(b, ctx, steps, tuple(c for c in mixed if c >= 2)[:2 if quick else 3]))
        if b >= SPREAD_MIN_BATCH:  # unequal contexts as served, at each context of the grid where one is long
            spread = [ctx for ctx in decode_ctx if ctx >= SPREAD_MIN_CONTEXT or quick]
            for ctx in spread[-1:] if quick else spread:
                case = DecodeCase(b, ctx, max(2, steps // 2), spread=True)
                if sum(case.contexts) <= lim.max_kv_tokens:
                    decode.append(case)
        if b in MIXED_PREFIX_BATCHES or (quick and b == batches[0]):
            # a prompt's chunks on its cached prefix beside the batch's decodes (chunked prefill as served)
            ctx = min(decode_ctx, key=lambda c: abs(c - 256))  # a served decode's context, not the longest
            fill = min(lim.budget - b, lim.max_context)
            for pre in contexts[-1:] if quick else contexts:
                chunks_at = tuple(c for c in (16, 64, 256, fill) if 2 <= c <= min(fill, lim.max_context - pre))
                if chunks_at and b * ctx <= lim.max_kv_tokens:
                    decode.append(DecodeCase(b, ctx, 2, tuple(sorted(set(chunks_at))), mixed_context=pre))
        if not quick:
            # beyond the prefill-priced cap, up to 90% of the pool: shared-prefix batches
            for ctx in decode_ctx:
                if lim.max_kv_tokens < b * ctx <= 0.9 * lim.pool_tokens and ctx >= 2 * bs:
                    decode.append(DecodeCase(b, ctx, steps // 2, (), shared=True))
    # Verify cases go last: a sweep cut short by its time limit loses them first (a model fitted
    # without them prices a verify row as any other decode row), and a plain engine's log of the sweep
    # replays up to them. Speculation pays at small batches: batches of powers of two up to
    # VERIFY_MAX_BATCH, every draft count over the shortest context, a mid one over the contexts
    # between and one over the longest (shared prefixes: no batch × context prefill to pay for first).
    verify_batches = [b for b in _geometric(1, VERIFY_MAX_BATCH, 2) if b in batches]
    shapes = [(ctx, d) for d in (VERIFY_DRAFTS[-2:-1] if quick else VERIFY_DRAFTS) for ctx in decode_ctx[:1]]
    if len(decode_ctx) > 1:
        shapes.append((decode_ctx[-1], VERIFY_DRAFTS[-2]))
    verify = [DecodeCase(b, ctx, 4 if quick else verify_steps(b), shared=True, drafts=d) for b in verify_batches
              for ctx, d in shapes if b * (1 + d) <= lim.budget and b * ctx <= 0.9 * lim.pool_tokens]
    # small batches also at a mid draft count over their context grid up to the longest, each request
    # over a context of its own as live (a shared prefix's blocks, read by every row, stay in the GPU's
    # L2 cache): a verify row's attention grows with its context as a decode's does, and a tree model
    # prices a context past the grid's last at the last's cost
    d = VERIFY_DRAFTS[len(VERIFY_DRAFTS) // 2]
    verify += [DecodeCase(b, ctx, verify_steps(b), drafts=d) for b in verify_batches if b <= SMALL_BATCH and not quick
               for ctx in small_ctx[1:] if b * (1 + d) <= lim.budget and b * ctx <= lim.max_kv_tokens]
    return _interleave(prefill, on_context, decode) + verify


def warmup_plan(plan: list[Case], limits: SweepLimits) -> list[Case]:
    """Short cases touching the sweep's extremes (largest chunk, every decode batch size, the
    longest decode context, the longest verify span), run unlogged first: kernel compilation,
    allocator growth and any per-batch-size capture happen here, not in measured steps."""
    top_chunk = min(limits.budget, limits.max_context)
    # sizes both multiples of 16 and not: Triton specializes integer arguments on divisibility by 16
    out: list[Case] = [PrefillCase(top_chunk), PrefillCase(16), PrefillCase(17)]
    if limits.max_prefill > limits.budget:  # the longest whole prompt (allocator growth, any compile)
        out.append(PrefillCase(limits.max_prefill))
    ctx_cases = [c for c in plan if isinstance(c, PrefillCase) and c.context]
    if ctx_cases:
        out += [PrefillCase(16, ctx_cases[0].context), PrefillCase(17, ctx_cases[0].context)]
    decodes = [c for c in plan if isinstance(c, DecodeCase)]
    for b in sorted({c.batch for c in decodes}):
        out.append(DecodeCase(b, 16, 2, (16, 17)))
    if decodes:
        out.append(DecodeCase(1, max(c.context for c in decodes), 2))
    verify = [c for c in decodes if c.drafts]
    if verify:  # the longest verify span
        out.append(DecodeCase(1, verify[0].context, 2, shared=True, drafts=max(c.drafts for c in verify)))
    return out


def plan_summary(plan: list[Case]) -> dict[str, int]:
    """Cases per kind."""
    counts: dict[str, int] = {}
    for case in plan:
        counts[case.kind] = counts.get(case.kind, 0) + 1
    return counts


def describe_plan(plan: list[Case], limits: SweepLimits) -> list[str]:
    """What ``profile --plan`` prints: the cases by kind and the largest shape of each."""
    summary = ", ".join(f"{kind} {n}" for kind, n in plan_summary(plan).items())
    lines = [f"{len(plan)} cases ({summary})"]
    prefill = [c for c in plan if isinstance(c, PrefillCase)]
    fresh = [c.chunk for c in prefill if not c.context]
    if fresh:
        whole = [n for n in fresh if n > limits.budget]
        top = min(max(fresh), limits.budget)
        lines.append(f"prefill chunks {min(fresh):,}–{top:,} tokens (budget {limits.budget:,})"
                     + (f"; whole prompts in one step up to {max(whole):,} tokens" if whole else ""))
    on_context = [c for c in prefill if c.context]
    if on_context:
        lines.append(f"prefill on a cached prefix: prefixes up to {max(c.context for c in on_context):,} tokens, "
                     f"chunks up to {max(c.chunk for c in on_context):,}")
    decode = [c for c in plan if isinstance(c, DecodeCase) and not c.drafts]
    if decode:
        kv = max(c.batch * c.context for c in decode)
        lines.append(f"decode: batches {_span(c.batch for c in decode)}, contexts "
                     f"{_span(c.context for c in decode)}, batch × context up "
                     f"to {kv:,} tokens ({kv / max(limits.pool_tokens, 1):.0%} of the KV pool's "
                     f"{limits.pool_tokens:,})")
    verify = [c for c in plan if isinstance(c, DecodeCase) and c.drafts]
    if verify:
        lines.append(f"verify (speculative decoding): batches {_span(c.batch for c in verify)}, "
                     f"{_span(c.drafts for c in verify)} drafts a request, contexts up to "
                     f"{max(c.context for c in verify):,}")
    return lines


def _span(values) -> str:
    values = list(values)
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
