"""How long the host takes to launch a prefill step while a decode step runs, by prompt size (CUDA).

The served engine overlaps: step k+1 is planned and launched while step k runs, and step k is
collected after that launch. A decode step followed by a prefill step is therefore logged until the
prefill's launch ends (simulator/cost/launch.py). Live chunked-off logs hold such decode steps longer
before long prompts than a launch fitted on 2,048-token chunks says; this measures it directly.

For each prompt size P: 64 requests decode; after a few decode steps one P-token prompt arrives.
Printed per P (medians over the repeats): the decode steps before (device-bound), the decode step
held back by the prefill's launch, the prefill step, the host time of the prefill's launch, and the
same launch with the device idle (synchronised first). On CUDA, three times on the device too: the
prefill's span as the profile's CUDA events time it (from the step before's end on the device to its
own), its GPU work alone (the device held by a sleep kernel until every kernel is queued, so no launch
gap is timed), and how long its device work runs on once the host's launch has returned (polled):
what a simulated launch must add after itself and what the step model should price. With
``--trace P`` a torch profiler table of the host calls in one busy launch of a P-token prefill is
printed too. ``--temperature`` samples
every request (the API's default is 1; the profile's sweep is greedy) and ``--busy N`` keeps N other
processes spinning on the CPU meanwhile (a loaded server's front ends and clients): how each moves
the launch.

    python scripts/launch_probe.py --sizes 512,2048,4096,8000 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import statistics
import time

import torch

from runtime.engine.step_loop import StepLoop
from runtime.executor.setup import build_engine
from traces.params import SamplingParams

# a sleep kernel longer than any launch (about 20 ms at a datacentre GPU's clock): the prefill's kernels
# are all queued behind it before the device reaches them
HOLD_CYCLES = 40_000_000


class TimedLaunches:
    """The runner, its ``launch`` host time noted per launched plan; ``profile``: the torch profiler
    over the first prefill launch; ``hold``: the device held by a sleep kernel while a prefill is
    launched; ``poll_tail``: after a prefill's launch, wait on the host for its device work to end
    (``tails``: seconds from the launch's return)."""

    def __init__(self, runner, sync_first: bool = False, profile: bool = False, hold: bool = False,
                 poll_tail: bool = False) -> None:
        self.runner, self.sync_first, self.profile_next_prefill = runner, sync_first, profile
        self.hold, self.poll_tail = hold, poll_tail
        self.launches: list[tuple[int, float]] = []  # (tokens beyond one per span, host seconds)
        self.tails: list[tuple[int, float]] = []  # (tokens beyond one per span, seconds)
        self.held_through: list[bool] = []  # per held prefill: the device still held when its launch returned
        self.profile_table = ""

    def launch(self, plan, requests):
        extra = plan.num_scheduled_tokens - len(plan.spans)
        if self.sync_first and extra and torch.cuda.is_available():
            torch.cuda.synchronize()
        if self.hold and extra:
            torch.cuda._sleep(HOLD_CYCLES)
        profiling = bool(self.profile_next_prefill and extra)
        if profiling:  # (a cudaDeviceSynchronize in the table may be the profiler's own)
            self.profile_next_prefill = False
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) if profiling else contextlib.nullcontext() as prof:
            t = time.perf_counter()
            handle = self.runner.launch(plan, requests)
            launched = time.perf_counter()
            self.launches.append((extra, launched - t))
        if self.hold and extra and handle.events is not None:
            self.held_through.append(not handle.events[0].query())  # (else the launch outlasted the sleep)
        if self.poll_tail and extra and handle.events is not None:
            done = handle.events[1]
            while not done.query():
                pass
            self.tails.append((extra, time.perf_counter() - launched))
        if profiling:
            self.profile_table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        return handle

    def collect(self, handle):
        return self.runner.collect(handle)


def _spin(parent: int) -> None:
    while os.getppid() == parent:  # (a probe killed outright leaves no spinner behind)
        pass


@contextlib.contextmanager
def busy_processes(n: int):
    """``n`` processes spinning on the CPU until the block ends (forked before CUDA is initialised)."""
    procs = [multiprocessing.get_context("fork").Process(target=_spin, args=(os.getpid(),), daemon=True)
             for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()


def one_case(parts, size: int, seed: int, *, decodes: int, context: int, temperature: float = 0.0,
             sync_first: bool = False, profile: bool = False, hold: bool = False, poll_tail: bool = False) -> dict:
    """One P-token prompt arriving while ``decodes`` requests of ``context`` prompt tokens decode."""
    vocab = parts.loaded.spec.vocab_size
    parts.runner.reset()
    core = parts.core()
    timed = TimedLaunches(parts.runner, sync_first, profile, hold, poll_tail)
    loop = StepLoop(core, timed, time.perf_counter, overlap=True)
    g = torch.Generator().manual_seed(seed)
    decode = SamplingParams(max_tokens=400, temperature=temperature, ignore_eos=True)
    for _ in range(decodes):
        core.add_request(torch.randint(0, vocab, (context,), generator=g).tolist(), decode, 0.0)
    steps = []
    while len(steps) < 40 + decodes // 8:  # prompts in, then plain decode steps
        steps.extend(loop.step())
    core.add_request(torch.randint(0, vocab, (size,), generator=g).tolist(),
                     SamplingParams(max_tokens=2, temperature=temperature, ignore_eos=True), 0.0)
    launched_before = len(timed.launches)  # (the first prompts' prefill steps are launches too)
    after = []
    while len(after) < 4:
        after.extend(loop.step())
    loop.drain()
    for rid in list(core.requests):
        core.abort(rid, 0.0)
    prefill = next(i for i, o in enumerate(after) if o.plan.num_scheduled_tokens > len(o.plan.spans))
    held = after[prefill - 1] if prefill else steps[-1]
    launch = next(s for e, s in timed.launches[launched_before:] if e >= size - 1)
    device = after[prefill].result.device_time
    tail = next((s for e, s in timed.tails if e >= size - 1), math.nan)
    if hold and not all(timed.held_through):
        raise RuntimeError(f"a {size}-token launch outlasted the sleep kernel: raise HOLD_CYCLES")
    return {"decode_ms": statistics.median(o.result.duration for o in steps[-10:]) * 1e3,
            "held_ms": held.result.duration * 1e3, "prefill_ms": after[prefill].result.duration * 1e3,
            "launch_ms": launch * 1e3, "device_ms": math.nan if device is None else device * 1e3,
            "tail_ms": tail * 1e3, "profile": timed.profile_table}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-shape", default="qwen3-0.6b")
    p.add_argument("--sizes", default="256,1024,2048,3072,4096,6144,8000")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decodes", type=int, default=64, help="requests decoding when the prompt arrives")
    p.add_argument("--context", type=int, default=200, help="their prompt length")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--trace", type=int, default=None, help="profile the host calls of one busy P-token launch")
    p.add_argument("--device", default="cuda")
    p.add_argument("--temperature", type=float, default=0.0, help="every request's (0: greedy)")
    p.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU meanwhile")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with busy_processes(args.busy):
        return _probe(args)


def _probe(args: argparse.Namespace) -> int:
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    parts = build_engine(f"random:{args.model_shape}", device=args.device, dtype=dtype,
                         max_model_len=args.max_model_len, max_num_batched_tokens=args.max_model_len,
                         enable_chunked_prefill=False)
    cuda = args.device == "cuda"
    parts.runner.device_timing = cuda  # the steps' times on the device, as a profile sweep records them
    batch = {"decodes": args.decodes, "context": args.context, "temperature": args.temperature}
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:  # warm-up: every size once (kernel compilation, allocator growth)
        one_case(parts, size, 999, **batch)
    rows = []
    print("| prompt | decode ms | held-back decode ms | prefill ms | launch ms (busy) | launch ms (idle) "
          "| device span ms | GPU work ms | device after launch ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in sizes:
        busy = [one_case(parts, size, r, **batch) for r in range(args.repeats)]
        idle = [one_case(parts, size, r, **batch, sync_first=True) for r in range(args.repeats)]
        held = [one_case(parts, size, r, **batch, hold=True) for r in range(args.repeats)] if cuda else []
        polled = [one_case(parts, size, r, **batch, poll_tail=True) for r in range(args.repeats)] if cuda else []
        med = {k: statistics.median(c[k] for c in busy)
               for k in ("decode_ms", "held_ms", "prefill_ms", "launch_ms", "device_ms")}
        med["idle_launch_ms"] = statistics.median(c["launch_ms"] for c in idle)
        med["gpu_work_ms"] = statistics.median(c["device_ms"] for c in held) if held else math.nan
        med["tail_ms"] = statistics.median(c["tail_ms"] for c in polled) if polled else math.nan
        rows.append({"prompt": size, **{k: None if math.isnan(v) else v for k, v in med.items()}})
        print(f"| {size} | {med['decode_ms']:.2f} | {med['held_ms']:.2f} | {med['prefill_ms']:.2f} | "
              f"{med['launch_ms']:.2f} | {med['idle_launch_ms']:.2f} | {med['device_ms']:.2f} | "
              f"{med['gpu_work_ms']:.2f} | {med['tail_ms']:.2f} |", flush=True)
    if args.trace:
        print(one_case(parts, args.trace, 7, **batch, profile=True)["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                       "temperature": args.temperature, "busy": args.busy, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
