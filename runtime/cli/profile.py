"""``minivllm profile``: sweep step shapes on the real runtime and log them, to fit a cost model.

    minivllm profile --out profile.jsonl --fit m.json          # default model, this machine
    minivllm profile --model random:qwen3-0.6b --device cuda --dtype bfloat16 --out p.jsonl --fit m.json
    minivllm profile --for data/traces/AzureLLMInferenceTrace_code.csv --fit m.json   # sized to a workload

The sweep (simulator/fitting/profile_plan.py) covers the cost model's features: pure prefill chunks,
chunks on cached context, decode at batch sizes × contexts, decode + prefill mixed. A short
unlogged warm-up runs first. With ``--fit`` the log is fitted at once (every Nth step held out).
``--passes N`` runs the sweep N times and reports how far the later passes moved from the first.
``--co-located K`` first runs K engines' sweeps on the device at once (runtime/bench/co_located.py):
the fit then knows how much longer a step runs behind another engine's work, for simulated replicas
that share a device.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import asdict

from runtime.cli.checks import Bounded
from runtime.cli.config_flags import add_engine_args, announce_load, engine_options, flag_error
from runtime.cli.errors import CLIError
from traces.params import InvalidRequest, SamplingParams

# (max context, max batch) on the CPU, where a sweep to the engine's limits would take hours; elsewhere
# the sweep covers what the engine takes: contexts to its max_model_len, batches to its max_num_seqs
CPU_LIMITS = (1024, 32)
QUICK_LIMITS = (128, 4)
QUIET_WAIT = 60.0  # s per case at most (a shared CPU; see runtime/bench/cpu_quiet.py)
NOISY_PASSES = 0.05  # a sweep whose passes disagree by more on the median decode case says so
CUDA_TIME_LIMIT = 240.0  # s since start; a guard so a slower GPU still finishes (and fits) within 5 minutes
CO_LOCATED_TIME = 60.0  # s of sweeping together (with --quick 10)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="sweep step shapes on the real runtime; log them (and fit a cost model)",
                       description=__doc__.split("\n\n")[2] if __doc__ else None)
    add_engine_args(p)
    g = p.add_argument_group("sweep")
    g.add_argument("--out", default="profile.jsonl", metavar="LOG", help="event log to write (default: %(default)s)")
    g.add_argument("--quick", action="store_true", help="a few cases of each shape class (CI, tests)")
    g.add_argument("--plan", action="store_true",
                   help="print the sweep (cases by kind, largest shapes, steps, an estimate of its time) and exit "
                        "without running it")
    g.add_argument("--for", dest="for_workload", metavar="WORKLOAD|LOG",
                   help="size the sweep to what this workload or log asks of a cost model: its longest request "
                        "(--max-context), longest prompt (--max-prefill) and largest decode batch (--max-batch); "
                        "flags given explicitly win")
    g.add_argument("--max-context", type=int, action=Bounded, at_least=1,
                   help="longest prompt a case builds (default: the engine's max_model_len, less decode headroom; "
                        "CPU 1024)")
    g.add_argument("--max-batch", type=int, action=Bounded, at_least=1,
                   help="most sequences decoding together (default: the engine's max_num_seqs; CPU 32)")
    g.add_argument("--max-prefill", type=int, action=Bounded, at_least=0,
                   help="also profile whole prompts up to N tokens in one step, beyond the step budget (what a "
                        "chunked-off what-if runs); the profiled engine's budget is raised to N (default: "
                        "max_model_len - 1; 0 = none beyond the budget)")
    g.add_argument("--time-limit", type=float, metavar="S", action=Bounded, at_least=0,
                   help="start no new case after S seconds (default: 240 on CUDA, none on the CPU; 0 = none)")
    g.add_argument("--passes", type=int, default=1, metavar="N", action=Bounded, at_least=1,
                   help="run the sweep N times: N samples of every shape for the fit, and how far the later "
                        "passes' step times moved from the first's (a noisy machine's sweep says so) "
                        "(default: %(default)s)")
    g.add_argument("--quiet-wait", type=float, metavar="S", action=Bounded, at_least=0,
                   help="CPU devices: before each case wait up to S seconds for other processes to leave "
                        "the CPU (default: 60, with --quick 0; 0 = off)")
    g.add_argument("--front-door", type=int, metavar="N", action=Bounded, at_least=0,
                   help="before the sweep, serve the engine (`minivllm serve`, these engine flags) and send it N "
                        "prompts one at a time, 16 tokens to max_model_len: the front door's delay from a request's "
                        "arrival to its first step, by prompt length, into the fit (default: 24, with --quick 0; "
                        "0 = none)")
    g.add_argument("--front-door-log", metavar="LOG",
                   help="the probe server's event log (default: beside --out, .front_door.jsonl)")
    g.add_argument("--co-located", type=int, metavar="K", action=Bounded, at_least=2,
                   help="before the sweep, run K engines of these flags on the device at once (each a 1/K share of a "
                        "GPU's memory, as serve --data-parallel-size K), sweeping together for --co-located-time; "
                        "their logs (beside --out, .co_located<i>.jsonl) go into the fit: how much longer a step "
                        "runs behind another engine's work, for replicas simulated on one device (default: off)")
    g.add_argument("--co-located-time", type=float, metavar="S", action=Bounded, above=0,
                   help=f"with --co-located: seconds the engines sweep together (default: {CO_LOCATED_TIME:.0f}, "
                        "with --quick 10)")
    g.add_argument("--co-located-member", help=argparse.SUPPRESS)  # i/K/BARRIER_DIR: one of those engines
    g.add_argument("--temperature", type=float, default=SamplingParams().temperature, metavar="T",
                   help="the sweep's requests' temperature: as served requests sample by default (the API's "
                        "default), a step's sampling is priced with them; 0 profiles greedy decoding, for "
                        "greedy-only traffic (default: %(default)s)")
    g.add_argument("--fit", metavar="M.json", help="fit a cost model from the log right away")
    g.add_argument("--holdout-every", type=int, default=5, action=Bounded, at_least=2,
                   help="with --fit: hold out every Nth step (default: %(default)s)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.set_defaults(func=run, profile_parser=p)


def command_line(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command, with the flags that differ from their defaults (recorded in the fit's meta)."""
    words = ["minivllm", "profile"]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default or (action.nargs == 0 and value != action.const):
            continue
        flag = max(action.option_strings, key=len)
        words += [flag] if action.nargs == 0 else [flag, str(value)]
    return shlex.join(words)


def _quiet_wait(args: argparse.Namespace) -> float:
    if args.quiet_wait is not None:
        return args.quiet_wait
    return 0.0 if args.quick else QUIET_WAIT


def _engine(args: argparse.Namespace, member=None):
    """The engine to profile, and the sweep limits for it (device defaults unless given); ``member``:
    one of a co-located profile's engines (runtime/bench/co_located.py), a share of the GPU's memory."""
    from runtime.engine.config import ConfigError, default_batched_tokens
    from runtime.executor.model.loader import load_model
    from runtime.executor.model.spec import ModelLoadError
    from runtime.executor.setup import build_engine, default_max_model_len
    from simulator.fitting.profile_plan import DECODE_HEADROOM, derive_limits

    opts = engine_options(args)
    announce_load(args.model)
    try:
        loaded = load_model(args.model, device=opts.get("device", "auto"), dtype=opts.get("dtype", "auto"),
                            seed=opts.get("seed", 0))
    except (ModelLoadError, ValueError) as e:
        raise CLIError(str(e)) from None
    cpu = loaded.device.type == "cpu"
    if member is not None and not cpu and opts.get("kv_cache_gb") is None and opts.get("num_blocks") is None:
        from runtime.executor.kv_cache import shared_gpu_kv_gb

        opts["kv_cache_gb"] = shared_gpu_kv_gb(loaded.device, member.of, opts.get("gpu_memory_utilization", 0.9))
    default_ctx, default_batch = QUICK_LIMITS if args.quick else CPU_LIMITS if cpu else (None, None)
    if args.for_workload:
        from runtime.cli.profile_for import workload_shape

        shape = workload_shape(args.for_workload, opts)
        print(f"sizing the sweep to {shape.describe()}", file=sys.stderr)
        default_ctx, default_batch = shape.max_request, shape.max_batch
        if args.max_prefill is None:
            args.max_prefill = shape.max_prompt
        opts.setdefault("max_model_len", min(loaded.model.rotary.max_positions, shape.max_request + DECODE_HEADROOM))
    max_context = args.max_context or default_ctx
    if max_context is not None:
        # room for the longest prompt plus what its requests decode while the rest of the batch prefills
        opts.setdefault("max_model_len", min(loaded.model.rotary.max_positions, max_context + DECODE_HEADROOM))
    else:  # the engine serve builds from these flags, its contexts all covered
        opts.setdefault("max_model_len", default_max_model_len(loaded))
        max_context = opts["max_model_len"]
    # the chunk ladder stops at the live budget (the one the engine would get: runtime/engine/config.py);
    # whole prompts beyond it need an engine whose budget holds them
    chunked = opts.get("enable_chunked_prefill", True)
    budget = opts.get("max_num_batched_tokens") or default_batched_tokens(chunked, opts["max_model_len"])
    max_prefill = opts["max_model_len"] - 1 if args.max_prefill is None else args.max_prefill
    if max_prefill > budget and chunked:
        opts["max_num_batched_tokens"] = max_prefill
    try:
        # timed as the live engine runs: no device sync between the forward and the sampling (a
        # benchmark instrument that adds a wait and a late sampling launch to every step)
        parts = build_engine(args.model, loaded=loaded, **opts)
    except ConfigError as e:
        raise flag_error(e) from None
    max_batch = args.max_batch or default_batch or parts.config.scheduler.max_num_seqs
    # a GPU prefills a decode case's batch × context in well under a second: its decode cases fill the pool
    limits = derive_limits(max_context, max_batch, parts.config, budget=budget, max_prefill=max_prefill,
                           fill_pool=not cpu)
    if limits.max_context < 16:
        raise CLIError(f"--max-model-len: {parts.config.scheduler.max_model_len} leaves no room for a sweep")
    return parts, limits


FRONT_DOOR_REQUESTS = 24


def _probe_front_door(args: argparse.Namespace) -> str | None:
    """The front-door probe (runtime/bench/front_door_probe.py) of the engine these flags build; its log,
    or None when it is off or could not run (a warning says why: the sweep goes on)."""
    from runtime.bench.front_door_probe import probe_front_door
    from runtime.cli.config_flags import engine_flags
    from runtime.serving.server.launch import free_port
    from traces.log_files import beside

    requests = args.front_door if args.front_door is not None else 0 if args.quick else FRONT_DOOR_REQUESTS
    if not requests or args.plan:
        return None
    log = str(args.front_door_log or beside(args.out, "front_door"))
    print(f"front door: serving the engine, {requests} prompts one at a time …", file=sys.stderr, flush=True)
    try:
        result = probe_front_door(engine_flags(args), log, requests=requests,
                                  server_log=beside(log, "server").with_suffix(".log"), port=free_port())
    except (RuntimeError, OSError) as e:
        print(f"warning: the front-door probe did not run ({e}); the fit has no intake delay", file=sys.stderr)
        return None
    print(f"front door: {result.sent - result.refused} prompts served in {result.seconds:.0f} s"
          + (f" ({result.refused} longer than the server takes)" if result.refused else "") + f"; log: {log}",
          file=sys.stderr)
    return log


def _member(args: argparse.Namespace):
    from runtime.bench.co_located import Member

    return Member.parse(args.co_located_member) if args.co_located_member else None


def _co_located_time(args: argparse.Namespace) -> float:
    if args.co_located_time is not None:
        return args.co_located_time
    return 10.0 if args.quick else CO_LOCATED_TIME


def _co_located(args: argparse.Namespace) -> list[str] | None:
    """Run ``--co-located K`` engines' sweeps together (before this process takes the device); their logs."""
    from runtime.bench.co_located import python_command, run_members
    from runtime.cli.config_flags import engine_flags
    from traces.log_files import beside

    k = args.co_located
    if not k or args.plan:
        return None
    sweep = [w for flag, value in (("--for", args.for_workload), ("--max-context", args.max_context),
                                   ("--max-batch", args.max_batch), ("--max-prefill", args.max_prefill))
             if value is not None for w in (flag, str(value))]
    seconds = _co_located_time(args)
    command = [*python_command(), "profile", *engine_flags(args), *sweep, *(["--quick"] if args.quick else []),
               "--temperature", str(args.temperature),
               "--front-door", "0", "--quiet-wait", "0", "--time-limit", str(seconds), "--no-progress"]
    logs = [beside(args.out, f"co_located{i}") for i in range(k)]
    print(f"co-located: {k} engines sweeping the device together for {seconds:.0f} s …", file=sys.stderr, flush=True)
    try:
        run_members(command, logs, timeout=seconds + 900)
    except RuntimeError as e:
        raise CLIError(f"--co-located: {e}") from None
    print(f"co-located: logs {', '.join(map(str, logs))}", file=sys.stderr)
    return [str(log) for log in logs]


def _fit(args: argparse.Namespace, result, plan, spread, front_door: str | None,
         co_located: list[str] | None) -> None:
    from runtime.cli.cost_model import fit_logs, print_fit
    from simulator.cost.logged_run import LoggedRun
    from simulator.fitting.profile_plan import plan_summary

    sweep = LoggedRun.read(args.out)  # read once: its header here, its steps and gaps in the fit
    model = fit_logs([sweep], holdout_every=args.holdout_every, command=command_line(args.profile_parser, args),
                     front_door=front_door, co_located=co_located)
    model = model.with_meta(profile={"steps": result.steps, "cases": plan_summary(plan),
                                     "skipped_cases": len(result.skipped), "seconds": round(result.seconds, 1),
                                     "git_commit": sweep.header.extra["profile"]["git_commit"],
                                     "cuda_alloc_retries": result.alloc_retries, "passes": args.passes,
                                     "temperature": args.temperature,
                                     "pass_spread": None if spread is None else asdict(spread)})
    model.save(args.fit)
    print_fit(model, args.fit)


# the shipped model a plan's time is estimated with, by device: a rough guide for other models and machines
ESTIMATE_MODELS = {"cpu": "smollm2-135m-cpu", "cuda": "qwen3-0.6b-h200"}


def _print_plan(parts, limits, plan, time_limit: float, passes: int) -> None:
    from runtime.bench.profile_shapes import estimate
    from simulator.cost.loading import load_cost_model
    from simulator.fitting.profile_plan import describe_plan

    name = ESTIMATE_MODELS.get(parts.runner.device.type, ESTIMATE_MODELS["cuda"])
    est = estimate(plan, parts.config, parts.loaded.spec.vocab_size, load_cost_model(name))
    sched = parts.config.scheduler
    print(f"profile plan for {parts.loaded.identity} on {parts.runner.device}: max_model_len {sched.max_model_len:,}, "
          f"max_num_seqs {sched.max_num_seqs}, budget {limits.budget:,}, KV pool {limits.pool_tokens:,} tokens")
    for line in describe_plan(plan, limits):
        print(f"  {line}")
    print(f"  {est.steps:,} steps, {est.tokens:,} tokens a pass, x {passes} pass(es); about "
          f"{est.seconds * passes:.0f} s of step time by the shipped model {name} (another model or machine differs: "
          "a guide), plus the host's time between cases")
    if time_limit > 0:
        print(f"  time limit {time_limit:.0f} s: cases not begun by then are skipped (verify cases come last)")


def run(args: argparse.Namespace) -> int:
    from runtime.bench.profile_shapes import pass_spread, profile
    from simulator.fitting.profile_plan import plan_summary, sweep_plan, warmup_plan

    try:
        SamplingParams(temperature=args.temperature)
    except InvalidRequest as e:
        raise CLIError(f"--temperature: {e}") from None
    member = _member(args)
    if member is not None:
        args.front_door = 0
    front_door = _probe_front_door(args)  # before this process takes the device: the server needs it
    co_located = _co_located(args)  # (so do those engines)
    started = time.monotonic()  # (the time limit is the sweep's: the model's load, its warm-up and cases)
    parts, limits = _engine(args, member)
    runner = parts.runner
    plan = sweep_plan(limits, quick=args.quick)
    if member is not None:
        from runtime.bench.co_located import member_plan

        plan = member_plan(plan)
    time_limit = args.time_limit
    if time_limit is None:
        time_limit = CUDA_TIME_LIMIT if runner.device.type == "cuda" else 0
    if args.plan:
        _print_plan(parts, limits, plan, time_limit, args.passes)
        return 0
    print(f"profiling {parts.loaded.identity} on {runner.device} ({str(runner.dtype).removeprefix('torch.')}): "
          f"{len(plan)} cases {plan_summary(plan)}, max context {limits.max_context}, max batch "
          f"{limits.max_batch}, budget {limits.budget}, whole prompts up to {limits.max_prefill}", file=sys.stderr)
    result = profile(parts, plan, warmup_plan(plan, limits), args.out, limits=limits, quick=args.quick,
                     deadline=started + time_limit if time_limit > 0 else None, quiet_wait=_quiet_wait(args),
                     progress=not args.no_progress, passes=args.passes, temperature=args.temperature,
                     before_sweep=None if member is None else lambda: member.wait_for_the_others() + time_limit)
    waited = f", {result.waited:.0f} s of it waiting for a quiet CPU" if result.waited >= 1 else ""
    print(f"{result.steps:,} steps in {result.seconds:.1f} s{waited} (+ {result.warmup_steps} warm-up steps, "
          f"{result.warmup_seconds:.1f} s, not logged); event log: {args.out}")
    if result.alloc_retries:
        print(f"warning: the CUDA caching allocator retried {result.alloc_retries} allocations during the sweep "
              "(each frees its cache and synchronizes): those steps are slow; lower --gpu-memory-utilization",
              file=sys.stderr)
    first_pass_skipped = plan[result.cases_run:]  # the first pass's cases never begun
    if first_pass_skipped:
        print(f"warning: time limit reached: {len(first_pass_skipped)} of {len(plan)} cases skipped "
              f"{plan_summary(first_pass_skipped)}", file=sys.stderr)
    elif result.skipped:
        print(f"time limit reached: {result.cases_run / len(plan):.1f} of {args.passes} passes run", file=sys.stderr)
    spread = pass_spread(plan, result.case_times)
    if spread is not None:
        print(f"passes: a decode case's step time moved {spread.median:.1%} from the first pass's (median over "
              f"{spread.cases} cases; 90th percentile {spread.p90:.1%})")
        if spread.median > NOISY_PASSES:
            print(f"warning: the passes disagree by {spread.median:.1%} on the median case: the machine's speed "
                  "moved during the sweep; a fit averages the passes, one pass alone is that uncertain (more "
                  "--passes, --quiet-wait, a quieter machine)", file=sys.stderr)
    if args.fit:
        _fit(args, result, plan, spread, front_door, co_located)
    elif co_located:
        print(f"to fit the sweep with them: minivllm cost-model fit {args.out} --co-located {' '.join(co_located)} "
              "--out M.json")
    return 0
