"""Drive the real engine through a sweep plan (simulator/fitting/profile_plan.py) and log every step.

Nothing is invented: each case is a workload (random-token prompts, sampled at the API's default
temperature unless told, ``ignore_eos``) added to a real ``EngineCore`` and stepped by the engine's
own ``StepLoop`` with the real executor, the way ``serve`` runs it: with overlapped steps (async
scheduling on CUDA: step n+1 planned and launched while step n runs) wherever the engine ``serve``
builds from the same flags overlaps them.
So the Step events — spans from the scheduler, times as the live loop stamps them — are a genuine
engine log that ``minivllm cost-model fit`` (or ``replay``, ``fold``) reads like any other, and a
step's logged time is what a served step of that shape logs (host work hidden behind the device's
where the live loop hides it), not the time of a step run on its own.

Decode cases end by finishing their requests between steps (``core.finish``, reason
``"profile"``, after completing the step in flight), the path a stop string takes: the log stays
a complete, replayable run. Verify cases (``DecodeCase.drafts``) hand the core a drafter
(``SweepDrafter``) proposing that many drafts for every decode; the other cases run without one,
as a plain engine does.

A sweep of several passes runs the plan again and again (every step logged, so a fit has that many
samples of each shape) and checks itself: ``pass_spread`` says how far each decode case's step time
moved from the first pass's, the noise any model fitted on the sweep carries.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from runtime.engine.config import EngineConfig
from runtime.engine.core import EngineCore
from runtime.engine.drafters import MAX_SPECULATIVE_TOKENS
from runtime.engine.request import Request
from runtime.engine.step_loop import StepLoop
from runtime.engine.types import EventSink, Executor, OverlappingExecutor, StepResult
from runtime.executor.heap import frozen_heap
from simulator.fitting.profile_plan import Case, DecodeCase, PrefillCase, SweepLimits, longest_request, plan_summary
from traces.log import LogWriter
from traces.params import SamplingParams
from traces.prompt import PromptSynthetic

if TYPE_CHECKING:
    from runtime.executor.setup import EngineParts

FINISH_REASON = "profile"


class SweepDrafter:
    """Proposes ``drafts`` tokens after each decode's last one (ids that follow it, modulo the
    vocabulary): real verify spans, whatever the weights accept of them."""

    def __init__(self, vocab_size: int) -> None:
        self.num_tokens = MAX_SPECULATIVE_TOKENS
        self.vocab_size = vocab_size
        self.drafts = 0

    def propose(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        v = self.vocab_size
        return [[(req.token_ids[-1] + 1 + i) % v for i in range(min(n, self.drafts))]
                for req, n in zip(requests, limits)]


def sweep_core(parts: EngineParts, sink: EventSink | None) -> EngineCore:
    """A core for ``ShapeSweep``: the profiled engine's, with a ``SweepDrafter`` for verify cases."""
    return parts.core(sink, drafter=SweepDrafter(parts.loaded.spec.vocab_size))


class SweepStalled(RuntimeError):
    """The engine scheduled nothing while a case still had unfinished requests."""


class ShapeSweep:
    """Runs cases on one core through a ``StepLoop``; ``now`` is seconds since the sweep began (the
    log's wall clock). ``overlap``: steps overlap as the live engine's do (``EngineParts.overlap``)."""

    def __init__(self, core: EngineCore, executor: Executor | OverlappingExecutor, *, vocab_size: int,
                 seed: int = 0, clock: Callable[[], float] = time.monotonic, overlap: bool = False,
                 temperature: float = SamplingParams().temperature) -> None:
        """``temperature``: every request's (default: a served request's; 0: greedy, whose steps copy no
        sampling parameters to the device and run an argmax in place of the sampler)."""
        self.core = core
        self.temperature = temperature
        self.executor = executor
        self.vocab_size = vocab_size
        self.seed = seed
        self._unique = 0
        self.clock = clock
        self.t0 = clock()
        self.loop = StepLoop(core, executor, self.now, overlap=overlap)
        self.durations: list[float] = []  # every step's, in order
        self._prefixes: set[int] = set()
        self.max_seqs = core.config.scheduler.max_num_seqs
        self.max_len = longest_request(core.config)
        # the core speculates only in verify cases: every other step is planned as a plain engine's
        # (a drafter, even one proposing nothing, takes the scheduler off its decode fast path)
        self.drafter, core.drafter = core.drafter, None

    @property
    def steps(self) -> int:
        return len(self.durations)

    def now(self) -> float:
        return self.clock() - self.t0

    def prompt(self, n: int, prefix: int = 0) -> PromptSynthetic:
        """``n`` random tokens, the first ``prefix`` of them shared by every prompt with that prefix
        length, the rest unique (no prefix-cache hit on anything earlier). Synthetic prompts keep
        the log small: the Arrived event holds seeds, not a GPU sweep's million token ids."""
        self._unique += 1
        shared = {"segment_ids": [prefix], "segment_len": prefix} if prefix else {}
        return PromptSynthetic(num_tokens=n, seed=self.seed, unique_seed=self._unique,
                               vocab_size=self.vocab_size, **shared)

    def add(self, prompt: PromptSynthetic, max_tokens: int) -> Request:
        params = SamplingParams(max_tokens=max_tokens, temperature=self.temperature, ignore_eos=True)
        rid = self.core.add_request(prompt, params, self.now())
        return self.core.requests[rid]

    def step(self) -> None:
        """One turn of the loop: plan and launch a step, complete the one before (with overlap; or
        this one, without)."""
        outs = self.loop.step()
        if len(outs) == 1 and outs[0].plan.empty:
            raise SweepStalled(f"engine scheduled nothing with {len(self.core.requests)} unfinished requests")
        self.durations += [out.result.duration for out in outs]

    def settle(self) -> None:
        """Complete the step in flight (before a request is finished or the drafter changes, as the
        live engine completes it before an abort)."""
        self.durations += [out.result.duration for out in self.loop.drain()]

    def live(self, reqs: Iterable[Request]) -> list[Request]:
        return [r for r in reqs if r.request_id in self.core.requests]

    def drain(self, reqs: list[Request]) -> None:
        while self.live(reqs):
            self.step()

    # --- cases ---------------------------------------------------------------------------------

    def run(self, case: Case) -> None:
        if isinstance(case, PrefillCase):
            self._prefill(case)
        else:
            self._decode(case)

    def _prefill(self, case: PrefillCase) -> None:
        if case.context and case.context not in self._prefixes:
            # the shared prefix computed once: its full blocks stay in the prefix cache (until
            # evicted), so later prompts that start with it begin their chunk at ``context``
            self.drain([self.add(self.prompt(case.context, case.context), 1)])
            self._prefixes.add(case.context)
        for _ in range(case.repeats):
            # max_tokens 1: the request finishes in the step that computes its chunk
            self.drain([self.add(self.prompt(case.context + case.chunk, case.context), 1)])

    def _decode(self, case: DecodeCase) -> None:
        bs = self.core.config.cache.block_size
        # shared: all but the last block is one prefix, computed by the first request, hit by the rest
        prefix = (case.context - 1) // bs * bs if case.shared else 0
        first, *others = case.contexts

        def request(context: int) -> Request:
            return self.add(self.prompt(context, prefix), max(1, self.max_len - context - 1))

        reqs = [request(first)]
        if prefix:  # its blocks must be computed before the others are admitted, or nobody hits them
            while reqs[0].request_id in self.core.requests and reqs[0].num_computed_tokens < reqs[0].num_prompt_tokens:
                self.step()
        reqs += [request(context) for context in others]
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in self.live(reqs)):
            self.step()  # prefill phase: chunks of the batch, with decodes of the early requests
        if case.drafts:
            if not isinstance(self.drafter, SweepDrafter):
                raise TypeError("a verify case needs a core with a SweepDrafter (sweep_core)")
            self.settle()
            self.drafter.drafts = case.drafts
            self.core.drafter = self.drafter
        try:
            for _ in range(case.steps):
                if not self.live(reqs):
                    break
                self.step()
        finally:
            if case.drafts:
                self.settle()
            self.core.drafter = None
        at = case.mixed_context  # the injected prompts' cached prefix, computed once beside the decodes
        if at and case.mixed_chunks and self.live(reqs) and len(self.core.requests) < self.max_seqs:
            self.drain([self.add(self.prompt(at, at), 1)])
        for chunk in case.mixed_chunks:
            if not self.live(reqs) or len(self.core.requests) >= self.max_seqs:
                break  # a fresh prompt could not join the batch: it would wait for the batch to end
            self.drain([self.add(self.prompt(at + chunk, at), 1)])  # decodes + this chunk (+ its rest)
            if self.live(reqs):
                self.step()  # a pure decode step between injections
        self.settle()
        now = self.now()
        for r in self.live(reqs):
            self.core.finish(r.request_id, now, FINISH_REASON)


@dataclass
class SweepResult:
    steps: int = 0
    cases_run: int = 0
    skipped: list[Case] = field(default_factory=list)
    seconds: float = 0.0
    waited: float = 0.0  # seconds ``before_case`` spent (waiting for a quiet CPU)
    case_times: list[float] = field(default_factory=list)  # per case run, the median of its steps' durations


@dataclass(frozen=True)
class PassSpread:
    """How far a sweep's later passes moved from its first: |t / t_first - 1| of each decode case's
    median step time, over the ``cases`` compared."""

    median: float
    p90: float
    cases: int


def pass_spread(plan: Sequence[Case], case_times: Sequence[float]) -> PassSpread | None:
    """``case_times`` of a sweep that ran ``plan`` pass after pass (the last pass may be cut short)
    against the first pass's. Only decode cases over contexts of their own: a shared-prefix case's
    prefix, or a prefill case's context, is cached by then, so a later pass runs fewer steps of them.
    None: no case ran twice."""
    n = len(plan)
    moved = []
    for i in range(n, len(case_times)):
        case, first = plan[i % n], case_times[i % n]
        if isinstance(case, DecodeCase) and not case.shared and first > 0:
            moved.append(abs(case_times[i] / first - 1))
    if not moved:
        return None
    moved.sort()
    return PassSpread(statistics.median(moved), moved[min(len(moved) - 1, int(0.9 * len(moved)))], len(moved))


def run_sweep(sweep: ShapeSweep, plan: list[Case], *, deadline: float | None = None,
              before_case: Callable[[], float] | None = None, progress: bool = True,
              desc: str = "profile") -> SweepResult:
    """Run ``plan`` in order; with ``deadline`` (a ``time.monotonic()`` value) the cases not yet
    begun when it passes are skipped and returned. ``before_case`` runs before each case and
    returns the seconds it waited."""
    from tqdm import tqdm

    result = SweepResult()
    t0 = time.monotonic()
    bar = tqdm(plan, desc=desc, unit="case", disable=not progress)
    try:
        for i, case in enumerate(bar):
            if deadline is not None and time.monotonic() > deadline:
                result.skipped = plan[i:]
                break
            if before_case is not None:
                result.waited += before_case()
            before = len(sweep.durations)
            sweep.run(case)
            sweep.settle()  # the case's last step is its own (and a time limit stops between whole cases)
            result.cases_run += 1
            times = sweep.durations[before:]
            result.case_times.append(statistics.median(times) if times else 0.0)
            bar.set_postfix(steps=sweep.steps, refresh=False)
    finally:
        bar.close()
    result.steps = sweep.steps
    result.seconds = time.monotonic() - t0
    return result


@dataclass(frozen=True)
class PlanEstimate:
    steps: int
    tokens: int  # computed, over all steps
    seconds: float  # the steps' time by a cost model


class _Priced:
    """An executor that prices each step with a cost model and samples token 0 (a sweep drafter's
    drafts follow the last token: every draft rejected, as on random weights)."""

    def __init__(self, model, budget: int) -> None:
        self.step_time = model.timing(budget).step_time
        self.steps = self.tokens = 0
        self.seconds = 0.0

    def execute(self, plan, requests) -> StepResult:
        self.steps += 1
        self.tokens += plan.num_scheduled_tokens
        self.seconds += self.step_time(plan.step, plan.spans, plan.drafts or ())
        return StepResult([[0] for s in plan.spans if s.sample], 0.0)


def estimate(plan: list[Case], config: EngineConfig, vocab_size: int, model) -> PlanEstimate:
    """The plan run through the engine core (no model, no device): its steps, and their time by
    ``model`` (a step-time cost model)."""
    priced = _Priced(model, config.scheduler.max_num_batched_tokens)
    sweep = ShapeSweep(EngineCore(config, drafter=SweepDrafter(vocab_size)), priced, vocab_size=vocab_size,
                       clock=lambda: 0.0)
    run_sweep(sweep, plan, progress=False)
    return PlanEstimate(priced.steps, priced.tokens, priced.seconds)


def git_commit() -> str | None:
    """The checkout's commit (step times are a property of the runtime's code), if it is one."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@dataclass
class ProfileResult(SweepResult):
    warmup_steps: int = 0
    warmup_seconds: float = 0.0
    alloc_retries: int | None = None  # CUDA caching-allocator retries during the measured sweep


@contextlib.contextmanager
def device_timed(runner):
    """The runner times each step on its device meanwhile (CUDA; elsewhere nothing changes)."""
    before, runner.device_timing = runner.device_timing, True
    try:
        yield
    finally:
        runner.device_timing = before


def profile(parts: EngineParts, plan: list[Case], warmup: list[Case], out: str | Path, *,
            limits: SweepLimits, quick: bool = False, deadline: float | None = None, seed: int = 0,
            quiet_wait: float = 0.0, progress: bool = True, passes: int = 1,
            before_sweep: Callable[[], float | None] | None = None,
            temperature: float = SamplingParams().temperature) -> ProfileResult:
    """Warm up on a scratch core (same runner and KV pool, nothing logged), then run ``plan``
    ``passes`` times on a fresh core whose events go to ``out``. The Header's ``extra`` adds
    ``hardware`` and the sweep. ``quiet_wait`` (CPU devices): before each case wait up to that long
    for other processes to leave the CPU. ``before_sweep``: runs after the warm-up, just before the
    sweep's clock starts (a co-located member's barrier); a time it returns is the sweep's deadline.
    ``temperature``: the requests' (default: a served request's, which samples unless it asks for
    greedy: its steps stage sampling parameters and run the sampler, which a greedy sweep never prices)."""
    from runtime.bench.cpu_quiet import wait_until_quiet
    from runtime.bench.hardware import cuda_alloc_retries, describe_device

    vocab = parts.loaded.spec.vocab_size
    gate = None
    if quiet_wait > 0 and parts.runner.device.type == "cpu":
        gate = lambda: wait_until_quiet(quiet_wait)  # noqa: E731
        gate()  # the warm-up too: it would slow whatever else is running
    overlap = parts.overlap  # the live engine's loop: async scheduling where serve has it
    warm = run_sweep(ShapeSweep(sweep_core(parts, None), parts.runner, vocab_size=vocab, seed=seed + 1,
                                overlap=overlap, temperature=temperature), warmup, progress=progress, desc="warm-up")
    header = parts.header("wall")
    extra = {**header.extra, "hardware": describe_device(parts.runner.device),
             "profile": {"quick": quick, **asdict(limits), "cases": plan_summary(plan), "passes": passes,
                         "temperature": temperature, "warmup_steps": warm.steps, "git_commit": git_commit()}}
    retries_before = cuda_alloc_retries(parts.runner.device)
    if before_sweep is not None:
        deadline = before_sweep() or deadline
    # no full collection over the start-up heap inside a measured step; each step's time on the device
    # logged beside the host's view of it (a launch of the next step can hold a step back)
    with frozen_heap(), LogWriter(out) as writer, device_timed(parts.runner):
        writer(msgspec.structs.replace(header, extra=extra))
        sweep = ShapeSweep(sweep_core(parts, writer), parts.runner, vocab_size=vocab, seed=seed, overlap=overlap,
                           temperature=temperature)
        result = run_sweep(sweep, plan * passes, deadline=deadline, before_case=gate, progress=progress)
    retries = cuda_alloc_retries(parts.runner.device)
    return ProfileResult(**vars(result), warmup_steps=warm.steps, warmup_seconds=warm.seconds,
                         alloc_retries=None if retries is None else retries - retries_before)
