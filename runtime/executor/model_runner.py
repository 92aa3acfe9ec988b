"""ModelRunner: the real executor behind EngineCore (``execute(plan, requests) -> StepResult``).

It owns the weights, the paged KV pool and the attention backend; per step it builds the inputs
(runtime/executor/model_inputs.py), runs the forward with logits only at sampling positions, samples, and
returns the tokens with the measured wall time of the whole step.

Randomness: each request draws from its own stream (``runtime.executor.sampling.request_rng``: seeded from
``SamplingParams.seed`` or from (engine seed, request id)); so a request's tokens depend only on
its logits and its stream, never on which other requests share the batch.

Speculative decoding: a span that verifies drafts (``plan.drafts``) gets one logits row per position,
each sampled as a decode would be, and commits its accepted drafts and one token more
(runtime/executor/speculative.py). A step of decodes and verify spans only replays a decode CUDA
graph, a row per token (``as_decode_rows``), while its tokens fit the graphs' largest batch.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from runtime.engine.config import EngineConfig
from runtime.engine.drafters import SpeculativeSpec, parse_speculative
from runtime.engine.request import Request
from runtime.engine.types import StepPlan, StepResult
from runtime.executor.attention import AttentionBackend, get_backend
from runtime.executor.block_table_rows import BlockTableRows
from runtime.executor.config import RunnerConfig
from runtime.executor.cuda_graphs import DecodeGraphs
from runtime.executor.jit_counter import JIT
from runtime.executor.kv_cache import allocate_kv
from runtime.executor.model.loader import LoadedModel
from runtime.executor.model_inputs import as_decode_rows, host_inputs, to_device
from runtime.executor.piecewise_graphs import PiecewiseGraphs
from runtime.executor.sampling import GREEDY_EPS, PendingSample, Sampler, SamplingBatch, plain_greedy, request_rng
from runtime.executor.speculative import Rewind, num_accepted, row_histories

# the reason a request whose logits went NaN or infinite is aborted with (the log's Aborted event)
NONFINITE_LOGITS = "non-finite logits"


def logits_rows(max_num_seqs: int, max_num_batched_tokens: int, speculative: SpeculativeSpec | None) -> int:
    """The most logits rows a step samples: one per sequence, 1 + K per speculating decode."""
    if speculative is None:
        return max_num_seqs
    return max(max_num_seqs, min(max_num_batched_tokens, max_num_seqs * (1 + speculative.num_tokens)))


@dataclass
class RunnerStats:
    """Cumulative seconds per phase; ``forward`` is exact only when ``sync_timing`` is on (CUDA)."""

    steps: int = 0
    prepare: float = 0.0
    forward: float = 0.0
    sample: float = 0.0
    total: float = 0.0
    tokens: int = 0
    per_step: list[tuple[int, int, float, float]] = field(default_factory=list)  # (seqs, tokens, total, fwd)

    @property
    def overhead(self) -> float:
        """Share of step time outside the model forward."""
        return 1.0 - self.forward / self.total if self.total else 0.0


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: RunnerConfig, engine: EngineConfig, *,
                 sync_timing: bool = False, record_steps: bool = False,
                 backend: AttentionBackend | None = None) -> None:
        """A runner with a KV pool of ``engine.cache.num_blocks`` blocks (runtime/executor/setup.py
        sizes it from the budget), shaped for ``engine.scheduler``'s limits.

        ``backend``: an instance instead of ``config.attention_backend`` (e.g. Triton under
        TRITON_INTERPRET on the CPU); ``sync_timing`` / ``record_steps``: benchmark instruments."""
        sched = engine.scheduler
        speculative = parse_speculative(engine.speculative)
        max_num_batched_tokens, max_num_seqs, max_model_len = (sched.max_num_batched_tokens, sched.max_num_seqs,
                                                               sched.max_model_len)
        block_size = engine.cache.block_size
        self.loaded = loaded
        self.config = config
        self.model = loaded.model
        self.spec = loaded.spec
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.block_size = block_size
        self.seed = engine.seed
        self.backend = backend or get_backend(config.attention_backend, self.device)
        self.num_blocks = engine.cache.num_blocks
        self.kv_caches = allocate_kv(self.spec, self.num_blocks, block_size, self.dtype, self.device)
        self.sampler = Sampler(backend=config.sampler)
        self._rngs: dict[int, random.Random] = {}
        self.sync_timing = sync_timing and self.device.type == "cuda"
        self.record_steps = record_steps
        # time each step on the device too (CUDA events; StepResult.device_time): a profile sweep's
        # steps then say what the device took apart from what the host held them to
        self.device_timing = False
        self.graphs: DecodeGraphs | None = None
        self.piecewise: PiecewiseGraphs | None = None  # prefill / mixed steps
        if self.device.type == "cuda":
            JIT.install()  # count kernel compilations from here on (servers report the ones after warm-up)
        if self.device.type == "cuda" and self.backend.name == "triton" and not config.enforce_eager:
            self.graphs = DecodeGraphs(self.model, self.kv_caches, self.backend, max_batch=max_num_seqs,
                                       max_model_len=max_model_len, block_size=block_size, device=self.device)
            self.graphs.capture()
            self.piecewise = PiecewiseGraphs(self.model, self.kv_caches, self.backend,
                                             max_tokens=max_num_batched_tokens,
                                             max_seqs=logits_rows(max_num_seqs, max_num_batched_tokens, speculative),
                                             device=self.device)
            self.piecewise.capture()
        self.async_scheduling = config.async_scheduling
        self.stats = RunnerStats()
        # the last launch's sampled ids (device) and their rows by request: the source of the next
        # launch's placeholder inputs
        self._previous_ids: torch.Tensor | None = None
        self._previous_rows: dict[int, int] = {}
        self.table_rows = BlockTableRows(-(-max_model_len // block_size), max_num_seqs)

    def reset(self) -> None:
        """Forget every request (a warm-up's): sampling streams, the last launch's ids, block-table rows.
        The next engine then sees the runner as freshly built (same tokens, same log)."""
        self._rngs.clear()
        self._previous_ids, self._previous_rows = None, {}
        self.table_rows = BlockTableRows(self.table_rows.array.shape[1], self.table_rows.array.shape[0])

    # --- randomness ---------------------------------------------------------------------------

    def rng(self, request: Request) -> random.Random | None:
        """The request's stream (None for greedy rows: they draw nothing). It survives preemption."""
        if request.params.temperature < GREEDY_EPS:
            return None
        rng = self._rngs.get(request.request_id)
        if rng is None:
            rng = self._rngs[request.request_id] = request_rng(self.seed, request.request_id,
                                                               request.params.seed)
        return rng

    def _forget_finished(self, requests: Mapping[int, Request]) -> None:
        if len(self._rngs) > 2 * len(requests) + 64:
            self._rngs = {rid: g for rid, g in self._rngs.items() if rid in requests}

    # --- the step -------------------------------------------------------------------------------

    def execute(self, plan: StepPlan, requests: Mapping[int, Request]) -> StepResult:
        return self.collect(self.launch(plan, requests))

    @torch.inference_mode()
    def launch(self, plan: StepPlan, requests: Mapping[int, Request]) -> _Launched:
        """Build the inputs, queue the forward and the sampling; return without waiting for the device."""
        t0 = time.perf_counter()
        timed = self.device_timing and self.device.type == "cuda"
        if timed:  # reached on the device once the step before is done there
            began = torch.cuda.Event(enable_timing=True)
            began.record()
        host = host_inputs(plan, requests, self.block_size, self._previous_rows, self.table_rows)
        rows = None if self.graphs is None else as_decode_rows(host)  # decodes and verify spans: a row a token
        if rows is not None and self.graphs.supports(rows):
            t1 = time.perf_counter()
            logits = self.graphs.run(rows, self._previous_ids)
        else:
            inputs = to_device(host, self.device, self._previous_ids)
            t1 = time.perf_counter()
            if self.piecewise is not None and self.piecewise.supports(host):
                logits = self.piecewise.run(host, inputs.meta, self._previous_ids)
            else:
                logits = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.backend,
                                    inputs.logits_indices)
        if self.sync_timing:
            torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        reqs = host.sampled_requests
        params = [r.params for r in reqs]
        counts = host.rows_per_sample
        rewinds: dict[int, Rewind] | None = None
        if counts is not None:  # speculating spans: a row per position
            batch, rewinds = self._verify_batch(reqs, params, counts, plan.drafts)
            self.table_rows.invalidate(plan.drafts)  # the core trims their rejected drafts' blocks
        elif plain_greedy(params):
            batch = SamplingBatch.greedy(len(reqs), self.device)
        else:
            batch = SamplingBatch.build(params, [self.rng(r) for r in reqs],
                                        [(r.token_ids, r.num_prompt_tokens) for r in reqs], self.device,
                                        self.spec.vocab_size)
        pending = self.sampler.sample_async(logits, batch)
        events = None
        if timed:
            done = torch.cuda.Event(enable_timing=True)
            done.record()
            events = (began, done)
        self._previous_ids = pending.device_ids
        if counts is None:
            self._previous_rows = {r.request_id: i for i, r in enumerate(reqs)}
        else:  # a speculating span's last token is not known at launch: no later input reads it
            firsts = itertools.accumulate(counts, initial=0)
            self._previous_rows = {r.request_id: i for r, i, c in zip(reqs, firsts, counts) if c == 1}
        self._forget_finished(requests)
        drafts = None if counts is None else [plan.drafts.get(r.request_id, []) for r in reqs]
        return _Launched(pending, reqs, len(plan.spans), host.num_tokens, t0, t1 - t0, t2 - t1,
                         time.perf_counter() - t2, drafts, rewinds, events)

    def _verify_batch(self, reqs: list[Request], params: list, counts: list[int],
                      drafts: dict[int, list[int]]) -> tuple[SamplingBatch, dict[int, Rewind]]:
        """The sampling rows of a step with speculating spans: each span's request once per row, its
        history growing by the drafts before the row; its stream drawn once per row (``Rewind``
        gives back what the commit does not use)."""
        row_params = [p for p, c in zip(params, counts) for _ in range(c)]
        if plain_greedy(params):
            return SamplingBatch.greedy(len(row_params), self.device), {}
        rngs, histories, rewinds = [], [], {}
        for r, p, c in zip(reqs, params, counts):
            rng = self.rng(r)
            rngs += [rng] * c
            if c > 1 and rng is not None:
                rewinds[r.request_id] = Rewind(rng, c)
            penalised = p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
            if c > 1 and penalised:
                histories += row_histories(r.token_ids, r.num_prompt_tokens, drafts[r.request_id])
            else:
                histories += [(r.token_ids, r.num_prompt_tokens)] * c
        return SamplingBatch.build(row_params, rngs, histories, self.device, self.spec.vocab_size), rewinds

    def collect(self, launched: _Launched) -> StepResult:
        """Wait for a launched step's tokens."""
        t = time.perf_counter()
        out = launched.pending.result()
        t_end = time.perf_counter()
        st = self.stats
        sample = launched.sample + (t_end - t)
        total = launched.prepare + launched.forward + sample
        st.steps += 1
        st.prepare += launched.prepare
        st.forward += launched.forward
        st.sample += sample
        st.total += total
        st.tokens += launched.num_tokens
        if self.record_steps:
            st.per_step.append((launched.num_spans, launched.num_tokens, total, launched.forward))
        device = None
        if launched.events is not None:
            began, done = launched.events
            done.synchronize()  # (at most the tail after the tokens' copy)
            device = began.elapsed_time(done) / 1e3
        if launched.drafts is not None:
            return self._commit_verified(launched, out, t_end - launched.start, device)
        logprobs = None if out.logprobs is None else [None if lp is None else [lp] for lp in out.logprobs]
        failed = None
        if out.nonfinite:
            failed = {launched.requests[row].request_id: NONFINITE_LOGITS for row in out.nonfinite}
        return StepResult([[t] for t in out.token_ids], t_end - launched.start, logprobs, failed, device)

    @staticmethod
    def _commit_verified(launched: _Launched, out, duration: float, device: float | None) -> StepResult:
        """A step with speculating spans: per span its accepted drafts and the row token after them,
        a logprobs dict per committed token (its row's), failed if a committed row was not finite."""
        ids, lps, bad = out.token_ids, out.logprobs, set(out.nonfinite)
        tokens: list[list[int]] = []
        logprobs: list | None = None if lps is None else []
        failed: dict[int, str] = {}
        row = 0
        for req, drafts in zip(launched.requests, launched.drafts):
            c = 1 + len(drafts)
            rows = ids[row:row + c]
            a = num_accepted(drafts, rows) if drafts else 0
            tokens.append([*drafts[:a], rows[a]])
            if logprobs is not None:
                mine = lps[row:row + a + 1]
                logprobs.append(None if mine[0] is None else mine)
            if bad and any(j in bad for j in range(row, row + a + 1)):
                failed[req.request_id] = NONFINITE_LOGITS
            if launched.rewinds and (rewind := launched.rewinds.get(req.request_id)) is not None:
                rewind.keep(a + 1)  # the uniforms of the rows after the committed one go back
            row += c
        return StepResult(tokens, duration, logprobs, failed or None, device)


@dataclass(slots=True)
class _Launched:
    """A step queued on the device; ``prepare``/``forward``/``sample``: host seconds of each phase."""

    pending: PendingSample
    requests: list[Request]  # of the sampled rows, in order
    num_spans: int
    num_tokens: int
    start: float
    prepare: float
    forward: float
    sample: float
    drafts: list[list[int]] | None = None  # per sampling span (of requests), when some span speculates
    rewinds: dict[int, Rewind] | None = None  # request id -> its stream as before its rows drew
    events: tuple | None = None  # CUDA events around its device work (``device_timing``)
