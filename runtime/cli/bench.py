"""``minivllm bench {core,...}``: benchmarks; each prints a table and can write JSON for plotting."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from runtime.cli.bench_matrix import add_parser as add_matrix_parser
from runtime.cli.bench_serve import add_parsers as add_serve_parsers
from runtime.cli.checks import Bounded
from runtime.engine.routers import ROUTERS


def _write_json(path: str | None, name: str, rows: list[dict], extra: dict | None = None) -> None:
    if not path:
        return
    doc = {
        "benchmark": name,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "processor": platform.processor(),
                 "python": sys.version.split()[0]},
        "results": rows,
        **(extra or {}),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2))
    print(f"wrote {path}")


def _core(args: argparse.Namespace) -> int:
    from runtime.bench import core_bench

    results = core_bench.run(steps=args.steps)
    print(core_bench.report(results))
    _write_json(args.json, "core", core_bench.as_json(results))
    return 0


def _sim(args: argparse.Namespace) -> int:
    from runtime.bench import sim_bench
    from runtime.cli import cost_models

    cost_models.load(args.cost_model)  # a bad name is a flag error before the trace is read

    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.chunked]
    results = sim_bench.run(trace=args.trace, cost_model=args.cost_model, modes=modes, limit=args.limit,
                            out_dir=args.out_dir, progress=not args.no_progress, replicas=args.replicas,
                            router=args.router)
    print(sim_bench.report(results))
    _write_json(args.json, "sim", sim_bench.as_json(results),
                {"trace": args.trace or sim_bench.DEFAULT_TRACE, "cost_model": args.cost_model,
                 "replicas": args.replicas, "router": args.router})
    return 0


def _throughput(args: argparse.Namespace) -> int:
    from runtime.bench import throughput
    from runtime.cli.config_flags import engine_options, flag_error
    from runtime.cli.errors import CLIError
    from runtime.engine.config import ConfigError

    model = _model_arg(args)
    peers: list[str] = []
    if args.peer == "hf":
        if args.hf_peers:
            peers = [p.strip() for p in args.hf_peers.split(",") if p.strip()]
            bad = [p for p in peers if p not in ("single", "static", "cb")]
            if bad:
                raise CLIError(f"--hf-peers: unknown peer {bad[0]!r} (single, static, cb)")
        else:  # CPU: HF generate one at a time and in static batches; CUDA: continuous batching + static batches
            import torch

            device = engine_options(args).get("device", "auto")
            on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
            peers = ["cb", "static"] if on_gpu else ["single", "static"]
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    sampling = _sampling(args)
    try:
        report = throughput.run(model, peers=peers, num_prompts=args.num_prompts, input_len=tuple(args.input_len),
                                output_len=tuple(args.output_len), static_batch=args.static_batch,
                                progress=not args.no_progress, sampling=sampling, **engine_options(args))
    except ConfigError as e:
        raise flag_error(e) from None
    print(report.table())
    _write_json(args.json, "throughput", [report.as_json()])
    return 0


_SAMPLING_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p"}


def _sampling(args: argparse.Namespace) -> dict | None:
    """The sampled run's fields (temperature 1 unless given), or None when no sampling flag is."""
    from runtime.cli.errors import CLIError
    from traces.params import InvalidRequest, SamplingParams

    given = {k: getattr(args, k) for k in _SAMPLING_FLAGS if getattr(args, k) is not None}
    if not given:
        return None
    sampling = {"temperature": 1.0, **given}
    if sampling["temperature"] == 0:
        raise CLIError("--temperature: 0 is the greedy run, which always runs; give a temperature > 0")
    try:
        SamplingParams(**sampling)
    except InvalidRequest as e:
        name = str(e).split()[0]
        raise CLIError(f"{_SAMPLING_FLAGS.get(name, '--temperature')}: {e}") from None
    return sampling


def _model_arg(args: argparse.Namespace) -> str | None:
    """The model to load, after checking the workload flags (--model/--model-shape, lengths)."""
    from runtime.cli.errors import CLIError

    if args.model and args.model_shape:
        raise CLIError("--model-shape: give either --model or --model-shape, not both")
    for flag, (lo, hi) in (("--input-len", args.input_len), ("--output-len", args.output_len)):
        if not 1 <= lo <= hi:
            raise CLIError(f"{flag}: need 1 <= LO <= HI, got {lo} {hi}")
    return f"random:{args.model_shape}" if args.model_shape else args.model


def _profile(args: argparse.Namespace) -> int:
    from runtime.bench import step_profile
    from runtime.cli.config_flags import engine_options, flag_error
    from runtime.engine.config import ConfigError

    try:
        prof = step_profile.run(_model_arg(args), num_prompts=args.num_prompts, input_len=tuple(args.input_len),
                                output_len=tuple(args.output_len), progress=not args.no_progress,
                                **engine_options(args))
    except ConfigError as e:
        raise flag_error(e) from None
    print(prof.table())
    _write_json(args.json, "profile", [prof.as_json()])
    return 0


def _spec(args: argparse.Namespace) -> int:
    from runtime.bench import spec_bench
    from runtime.cli.config_flags import engine_options, flag_error
    from runtime.cli.errors import CLIError
    from runtime.engine.config import ConfigError

    options = engine_options(args)
    speculative = options.pop("speculative", "")
    if not speculative and not args.acceptance:
        raise CLIError("--speculative: give the drafter to measure (e.g. ngram:4), or --acceptance RATES")
    if args.model and args.model_shape:
        raise CLIError("--model-shape: give either --model or --model-shape, not both")
    model = f"random:{args.model_shape}" if args.model_shape else args.model
    cost_model = None
    if args.cost_model:
        from runtime.cli import cost_models

        cost_model = cost_models.load(args.cost_model)  # a bad name is a flag error before the model loads
    try:
        results = spec_bench.run(model, speculative=speculative, batches=args.batch, workloads=args.workload,
                                 max_tokens=args.max_tokens, acceptance=args.acceptance, tokenizer=args.tokenizer,
                                 repeats=args.repeats, cost_model=cost_model, log_dir=args.log_dir, **options)
    except ConfigError as e:
        raise flag_error(e) from None
    print(spec_bench.table(results))
    _write_json(args.json, "spec", [r.as_json() for r in results], {"cost_model": args.cost_model})
    return 0 if all(r.identical is not False for r in results) else 1


def _rates(text: str) -> list[float]:
    from traces.acceptance import parse_rate

    try:
        rates = [parse_rate(x) for x in text.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates in [0, 1], got {text!r}")
    return rates


def _decode_kernel(args: argparse.Namespace) -> int:
    from runtime.bench import decode_kernel_bench

    return decode_kernel_bench.main(["--json", args.json] if args.json else [])


def _add_workload_args(p: argparse.ArgumentParser, num_prompts: int, input_len: list[int],
                       output_len: list[int]) -> None:
    """Engine flags + the random-prompt workload of the throughput-style benchmarks."""
    from runtime.cli.config_flags import add_engine_args

    add_engine_args(p)
    p.add_argument("--model-shape", choices=["qwen3-0.6b", "smollm2-135m"],
                   help="real model shapes with random weights (instead of --model)")
    p.add_argument("--num-prompts", type=int, default=num_prompts, action=Bounded, at_least=1,
                   help="prompts, all arriving at once (default: %(default)s)")
    p.add_argument("--input-len", type=int, nargs=2, default=input_len, metavar=("LO", "HI"), action=Bounded,
                   at_least=1, help=f"prompt lengths, uniform in [LO, HI] (default: {input_len[0]} {input_len[1]})")
    p.add_argument("--output-len", type=int, nargs=2, default=output_len, metavar=("LO", "HI"), action=Bounded,
                   at_least=1, help=f"output lengths, uniform in [LO, HI] (default: {output_len[0]} {output_len[1]})")


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (side by side with peers where there are any)")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    core = kinds.add_parser("core", help="µs per engine step (scheduler + block manager + commit)")
    core.add_argument("--steps", type=int, default=300, action=Bounded, at_least=1,
                      help="measured steps per scenario (default: %(default)s)")
    core.add_argument("--json", metavar="PATH", help="also write results as JSON")
    core.set_defaults(func=_core)
    sim = kinds.add_parser("sim", help="a whole trace through the simulator (chunked on/off): × real time")
    sim.add_argument("--trace", help="workload or trace file (default: data/traces/AzureLLMInferenceTrace_conv.csv)")
    sim.add_argument("--cost-model", default="qwen3-0.6b-h200",
                     help="cost-model JSON or a shipped name (default: %(default)s)")
    sim.add_argument("--chunked", choices=["both", "on", "off"], default="both",
                     help="chunked prefill on, off, or both one after the other (default: %(default)s)")
    sim.add_argument("--limit", type=int, action=Bounded, at_least=1, help="first N requests only (default: all)")
    sim.add_argument("--replicas", type=int, default=1, action=Bounded, at_least=1,
                     help="a fleet of this many replicas (default: %(default)s)")
    sim.add_argument("--router", choices=list(ROUTERS), default="least-loaded",
                     help="the fleet's router (default: %(default)s)")
    sim.add_argument("--out-dir", default="out/bench_sim", help="where the event logs go (default: %(default)s)")
    sim.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    sim.add_argument("--json", metavar="PATH", help="also write results as JSON")
    sim.set_defaults(func=_sim)
    tp = kinds.add_parser("throughput", help="offline throughput vs HF transformers on the same prompts")
    _add_workload_args(tp, num_prompts=64, input_len=[32, 256], output_len=[16, 256])
    tp.add_argument("--peer", choices=["hf", "none"], default="hf",
                    help="run HF transformers side by side, or not (default: %(default)s)")
    tp.add_argument("--hf-peers", metavar="LIST",
                    help="comma list of single, static, cb (default: single,static on CPU; cb,static on CUDA)")
    tp.add_argument("--static-batch", type=int, default=16, action=Bounded, at_least=1,
                    help="batch size of the static HF peer (default: %(default)s)")
    tp.add_argument("--threads", type=int, action=Bounded, at_least=1,
                    help="torch CPU threads for every peer (default: torch's choice)")
    s = tp.add_argument_group("sampled run", "any of these runs the engine a second time on the same prompts, "
                              "sampled, and reports it beside greedy")
    s.add_argument("--temperature", type=float, help="the sampled run's temperature (default: 1 once any of "
                   "these is given)")
    s.add_argument("--top-p", type=float, help="its top-p (default: off)")
    s.add_argument("--top-k", type=int, help="its top-k (default: off)")
    s.add_argument("--min-p", type=float, help="its min-p (default: off)")
    tp.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    tp.add_argument("--json", metavar="PATH", help="also write results as JSON")
    tp.set_defaults(func=_throughput)
    pr = kinds.add_parser("profile", help="per-step breakdown: schedule, metadata, forward, sampling, commit")
    _add_workload_args(pr, num_prompts=256, input_len=[100, 1024], output_len=[512, 512])
    pr.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    pr.add_argument("--json", metavar="PATH", help="also write per-step phases as JSON")
    pr.set_defaults(func=_profile)
    sp = kinds.add_parser("spec", help="speculative decoding against plain decoding (tok/s, acceptance), "
                          "single stream and batched, repetitive and open workloads")
    from runtime.bench.spec_bench import WORKLOADS
    from runtime.cli.config_flags import add_engine_args

    add_engine_args(sp)
    sp.add_argument("--model-shape", choices=["qwen3-0.6b", "smollm2-135m"],
                    help="real model shapes with random weights (instead of --model; needs --tokenizer)")
    sp.add_argument("--batch", type=int, nargs="+", default=[1, 8], action=Bounded, at_least=1,
                    help="requests at once, one run each (default: 1 8)")
    sp.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(WORKLOADS),
                    help="repeat a passage, or write a story (default: repetitive open)")
    sp.add_argument("--max-tokens", type=int, default=128, action=Bounded, at_least=1,
                    help="output cap per request (default: %(default)s)")
    sp.add_argument("--repeats", type=int, default=1, action=Bounded, at_least=1,
                    help="time every run this many times, plain and speculative interleaved: tok/s and the "
                    "speed-up are medians, the speed-up's range beside it (default: %(default)s)")
    sp.add_argument("--acceptance", type=_rates, default=[], metavar="RATES",
                    help="also a drafter of controlled acceptance per rate, e.g. 0,0.5,0.8,1: it proposes the "
                    "plain run's own tokens, each kept with that probability")
    sp.add_argument("--cost-model", metavar="M",
                    help="also re-simulate every run's log with this cost model (JSON or a shipped name) and "
                    "report the predicted speed-up beside the live one")
    sp.add_argument("--log-dir", metavar="DIR", help="keep every run's event log there (default: none; with "
                    "--cost-model, a temporary folder)")
    sp.add_argument("--json", metavar="PATH", help="also write results as JSON")
    sp.set_defaults(func=_spec)
    dk = kinds.add_parser("decode-kernel", help="Triton paged decode vs torch gather+SDPA, µs and GB/s (CUDA)")
    dk.add_argument("--json", metavar="PATH", help="also write results as JSON")
    dk.set_defaults(func=_decode_kernel)
    add_serve_parsers(kinds)
    add_matrix_parser(kinds)
