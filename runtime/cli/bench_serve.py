"""``minivllm bench serve`` (a workload replayed against a server, with its arrival times, as users
load it) and ``minivllm bench live`` (the same workload on the engine in process, no HTTP).

    minivllm bench serve WORKLOAD --url http://127.0.0.1:8000/v1 --slo ttft_ms=1000,tpot_ms=50
    minivllm bench serve WORKLOAD --launch --model random:qwen3-0.6b --tokenizer TOK --dtype bfloat16
    minivllm bench serve --synthetic 200 --rate 8 --input-len uniform:64:512 --output-len fixed:128 ...
    minivllm bench live WORKLOAD --model ... --trace live.jsonl

WORKLOAD is anything ``simulate`` reads (Azure CSV, Mooncake JSONL, a recorded log or a saved
workload); ``--synthetic N`` draws Poisson/gamma arrivals instead. ``--launch`` starts
``minivllm serve`` with every flag after it (the engine flags), records its event log
(``--server-trace``), waits for ``/ready``, replays, and stops it: one command, a live log ready for
``analyze``, ``simulate`` and ``replay``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from runtime.bench.serve_verdict import verdict
from runtime.cli.checks import Bounded
from runtime.cli.errors import CLIError
from runtime.cli.workload import add_workload_args, workload_from_args


def _workload(args: argparse.Namespace):
    from traces.generators import LengthDist, generate

    if (args.workload is None) == (args.synthetic is None):
        raise CLIError("give a WORKLOAD file or --synthetic N (one of them)")
    if args.synthetic is not None:
        dists = {}
        for flag, spec in (("--input-len", args.input_len), ("--output-len", args.output_len)):
            try:
                dists[flag] = LengthDist.parse(spec, seed=args.workload_seed)
            except (ValueError, OSError) as e:
                raise CLIError(f"{flag}: {e}") from None
        wl = generate(args.synthetic, rate=args.rate, cv=args.cv, input_len=dists["--input-len"],
                      output_len=dists["--output-len"], shared_prefix=args.shared_prefix, seed=args.workload_seed)
        return wl.scale_rate(args.rate_scale) if args.rate_scale != 1.0 else wl
    return workload_from_args(args, args.workload, seed=args.workload_seed)


def _add_workload_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", help="Azure CSV, Mooncake JSONL, a minivllm log or workload "
                                               "(default: --synthetic)")
    add_workload_args(p)
    g = p.add_argument_group("synthetic workload (instead of WORKLOAD)")
    g.add_argument("--synthetic", type=int, action=Bounded, at_least=1, metavar="N",
                   help="N requests with Poisson/gamma arrivals (default: off)")
    g.add_argument("--rate", type=float, default=4.0, action=Bounded, above=0,
                   help="with --synthetic: mean arrivals per second (default: %(default)s)")
    g.add_argument("--cv", type=float, default=1.0, action=Bounded, at_least=0,
                   help="with --synthetic: burstiness, 1 = Poisson (default: %(default)s)")
    g.add_argument("--input-len", default="uniform:32:512",
                   help="with --synthetic: fixed:N | uniform:LO:HI | lognormal:MEAN:CV[:MAX] (default: %(default)s)")
    g.add_argument("--output-len", default="uniform:32:256",
                   help="with --synthetic: as --input-len (default: %(default)s)")
    g.add_argument("--shared-prefix", type=int, default=0, action=Bounded, at_least=0, metavar="TOKENS",
                   help="with --synthetic: the first TOKENS of every prompt are one shared document (prompts "
                        "count them in --input-len) (default: %(default)s, none shared)")
    g.add_argument("--prompt-vocab", type=int, action=Bounded, at_least=2, metavar="N",
                   help="fold prompt token ids into [0, N), for a model with a smaller vocabulary than the "
                        "trace's synthetic prompts (32,000) (default: as they are)")
    g.add_argument("--workload-seed", type=int, default=0,
                   help="seed of synthetic prompts and arrivals (default: %(default)s)")


def _text_decoder(source: str):
    """ids -> text with the tokenizer of ``source`` (its lengths then count in that tokenizer)."""
    from runtime.executor.model.loader import default_model_path, load_tokenizer
    from runtime.executor.model.spec import ModelLoadError

    try:
        tokenizer = load_tokenizer(default_model_path() if source == "default" else source)
    except ModelLoadError as e:
        raise CLIError(f"--text-prompts: {e}") from None
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def _server(url: str, api_key: str | None, served_model_name: str | None) -> tuple[str, str, int | None]:
    """(the API base, the model to send, its max_model_len if its card says): a server must answer
    at ``url``; without --served-model-name, its first /v1/models entry."""
    from runtime.bench.server_probe import NoModelList, ProbeError, api_base, served_models

    try:
        base = api_base(url)
        models = served_models(base, api_key)  # with --served-model-name too: a server must answer
    except NoModelList as e:
        if served_model_name:  # something answers there, and the model is named: the list is not needed
            return base, served_model_name, None
        raise CLIError(f"--url: {e}") from None
    except ProbeError as e:
        raise CLIError(f"--url: {e}") from None
    model = served_model_name or next(iter(models))
    return base, model, models.get(model)


def fit_to_server(workload, max_model_len: int):
    """``workload`` as a server of ``max_model_len`` takes it: a request whose prompt leaves no room
    for a token is left out, one whose prompt + output passes the limit has its output cut to fit
    (a server would refuse both with a 400: errors that measure the workload, not the server).
    (the workload, how many left out, how many cut)."""
    import msgspec

    from traces.workload import Workload

    kept, dropped, cut = [], 0, 0
    for spec in workload:
        room = max_model_len - spec.num_prompt_tokens
        if room < 1:
            dropped += 1
            continue
        if spec.params.max_tokens > room:
            spec = msgspec.structs.replace(spec, params=msgspec.structs.replace(spec.params, max_tokens=room))
            cut += 1
        kept.append(spec)
    if not dropped and not cut:
        return workload, 0, 0
    return Workload(kept, seed=workload.seed, source=workload.source, meta=workload.meta), dropped, cut


def _engine_side(records, log: str, decode) -> dict | None:
    """The client's records against the server's log, request by request (printed), or None with
    one line saying why they cannot be paired."""
    from runtime.bench import serve_gap
    from runtime.bench.serve_join import NoPromptIds

    try:
        gap = serve_gap.compare(records, log, decode)
    except NoPromptIds as e:
        print(f"client vs engine: not compared: {e}")
        return None
    print(serve_gap.render(gap))
    return gap


@contextlib.contextmanager
def _beside_the_replay(args: argparse.Namespace, url: str, model: str):
    """(connections without requests, oversized requests) held or sent during the replay: each None
    unless its flags ask for it (--idle-connections / --trickling-connections, --oversized-rate)."""
    with contextlib.ExitStack() as stack:
        held = oversized = None
        if args.idle_connections or args.trickling_connections:
            from urllib.parse import urlsplit

            from runtime.bench.idle_clients import IdleClients

            where = urlsplit(url)
            held = stack.enter_context(IdleClients(where.hostname or "127.0.0.1", where.port or 80,
                                                   args.idle_connections, args.trickling_connections))
        if args.oversized_rate:
            from runtime.bench.oversized_requests import OversizedRequests

            oversized = stack.enter_context(OversizedRequests(url, model, args.oversized_rate, args.api_key))
        yield held, oversized


def _serve(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from runtime.bench import serve_client
    from runtime.bench.serve_shards import run_sharded
    from runtime.bench.server_process import ServerProcess
    from runtime.serving.server.launch import free_port

    try:
        slo = serve_client.Slo.parse(args.slo) if args.slo else None
    except ValueError as e:
        raise CLIError(f"--slo: {e}") from None
    wl = _workload(args)
    if not len(wl):
        raise CLIError("the workload has no requests")
    decode = _text_decoder(args.text_prompts) if args.text_prompts else None
    server = None
    url = args.url
    if args.launch is not None:
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1"
        for path in (args.server_trace, args.server_log):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        server = ServerProcess([*args.launch, "--trace-if-exists", "overwrite"], port=port,
                               trace=args.server_trace, log_file=args.server_log)
        print(f"starting: {' '.join(server.cmd)}", file=sys.stderr)
        with tqdm(desc="waiting for /ready", unit="s", disable=args.no_progress, bar_format="{desc}: {n:.0f} s") as bar:
            try:
                waited = server.wait_ready(args.ready_timeout, on_wait=lambda s: (setattr(bar, "n", s), bar.refresh()))
            except RuntimeError as e:
                raise CLIError(f"--launch: {e}; see {args.server_log}") from None
        print(f"the server answered /ready {waited:.1f} s after its start", file=sys.stderr)
    try:
        url, model, max_len = _server(url, args.api_key, args.served_model_name)
        if max_len is not None:
            wl, dropped, cut = fit_to_server(wl, max_len)
            if dropped or cut:
                print(f"the server's max_model_len is {max_len:,}: {dropped:,} request(s) whose prompt fills it left "
                      f"out, {cut:,} with their output cut to fit", file=sys.stderr)
            if not len(wl):
                raise CLIError(f"no request of the workload fits the server's max_model_len ({max_len:,})")
        print(f"replaying {len(wl):,} requests ({wl.duration:,.1f} s of arrivals) against {url} ({model})",
              file=sys.stderr)
        bar = tqdm(total=len(wl), unit="req", desc="bench serve", disable=args.no_progress, mininterval=0.5)
        failed = [0]

        def progress(record) -> None:
            failed[0] += record.error is not None
            bar.update(1)
            if failed[0]:
                bar.set_postfix(errors=failed[0], refresh=False)

        with bar, _beside_the_replay(args, url, model) as (held, oversized):
            if args.client_processes == 1:
                records, wall = serve_client.run(url, wl, model, api_key=args.api_key,
                                                 ignore_eos=not args.no_ignore_eos, vocab=args.prompt_vocab,
                                                 decode=decode, timeout=args.timeout, time_limit=args.time_limit,
                                                 progress=progress)
            else:
                bodies, records = serve_client.prepare(wl, model, ignore_eos=not args.no_ignore_eos,
                                                       vocab=args.prompt_vocab, decode=decode)
                try:
                    records, wall = run_sharded(args.client_processes, url, bodies, records, args.api_key,
                                                args.timeout, 4096, args.time_limit, progress)
                except RuntimeError as e:
                    raise CLIError(f"--client-processes: {e}") from None
    finally:
        if server is not None:
            stopping = time.monotonic()
            server.stop()  # (the log's flush and the engine's exit included)
            print(f"the server stopped in {time.monotonic() - stopping:.1f} s", file=sys.stderr)
    summary = serve_client.summarize(records, wall, slo)
    print(serve_client.render(summary))
    held_report = held.report() if held is not None else None
    oversized_report = oversized.report() if oversized is not None else None
    for report in (held_report, oversized_report):
        if report is not None:
            print(report.render())
    gap = _engine_side(records, args.server_trace, decode) if server is not None else None
    queue = gap["engine_queue_ms"]["p99"] if gap else None
    line = verdict(summary["send_lag_ms"]["p99"], queue)
    if line:
        print(line)
    if server is not None:
        print(f"server log: {args.server_trace} (minivllm analyze {args.server_trace})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = {"benchmark": "serve", "url": url, "model": model, "workload": wl.source or "synthetic",
               "launch": args.launch, "summary": summary, "engine_vs_client": gap,
               "connections_without_requests": asdict(held_report) if held_report else None,
               "oversized_requests": asdict(oversized_report) if oversized_report else None,
               "requests": [asdict(r) for r in records]}  # serve_client.RequestRecord(**row) reads one back
        Path(args.json).write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.json}")
    return 0 if summary["completed"] else 1


def _live(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from analysis.frames import load_frames
    from analysis.metrics import render_summary, summarize
    from runtime.bench.live import replay_live
    from runtime.cli.config_flags import announce_load, engine_options, flag_error
    from runtime.engine.config import ConfigError
    from runtime.serving.llm_engine import LLMEngine
    from runtime.serving.warmup import warm_up

    wl = _workload(args)
    if not len(wl):
        raise CLIError("the workload has no requests")
    Path(args.trace).parent.mkdir(parents=True, exist_ok=True)
    announce_load(args.model)
    try:
        engine = LLMEngine(args.model, trace=args.trace, if_exists="overwrite", tokenizer=args.tokenizer,
                           **engine_options(args))
    except ConfigError as e:
        raise flag_error(e) from None
    if args.warmup or (args.warmup is None and engine.parts.runner.device.type == "cuda"):
        report = warm_up(engine)
        print(f"warmed up in {report.seconds:.1f} s ({report.steps} steps)", file=sys.stderr)
    with tqdm(total=len(wl), unit="req", desc="bench live", disable=args.no_progress, mininterval=0.5) as bar:
        steps = replay_live(engine, wl, vocab=args.prompt_vocab, on_finish=bar.update)
    engine.close()
    summary = summarize(load_frames(args.trace))
    print(render_summary(summary, title=f"bench live: {steps:,} steps"))
    print(f"engine log: {args.trace}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"benchmark": "live", "summary": summary}, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


def add_parsers(kinds: argparse._SubParsersAction) -> None:
    from runtime.cli.config_flags import add_engine_args

    sv = kinds.add_parser("serve", help="replay a workload against an OpenAI server with its arrival times: "
                                        "client TTFT/TPOT/ITL, goodput", description=__doc__.split("\n\n")[0])
    _add_workload_source(sv)
    g = sv.add_argument_group("server")
    g.add_argument("--url", default="http://127.0.0.1:8000/v1",
                   help="the server: http://HOST:PORT, with or without /v1 (default: %(default)s)")
    g.add_argument("--served-model-name", help="model id to send (default: the server's first /v1/models entry)")
    g.add_argument("--api-key", help="bearer token (default: none)")
    g.add_argument("--launch", nargs=argparse.REMAINDER, metavar="ENGINE_FLAGS",
                   help="start `minivllm serve ENGINE_FLAGS` on a free port first, stop it after; must come last "
                        "(default: use --url)")
    g.add_argument("--server-trace", default="out/bench_serve/live.jsonl",
                   help="with --launch: the server's event log (default: %(default)s)")
    g.add_argument("--server-log", default="out/bench_serve/server.log",
                   help="with --launch: the server's output (default: %(default)s)")
    g.add_argument("--ready-timeout", type=float, default=900.0, action=Bounded, above=0,
                   help="with --launch: seconds to wait for /ready (default: %(default)s)")
    c = sv.add_argument_group("client")
    c.add_argument("--slo", metavar="TERMS", help="goodput SLO, e.g. ttft_ms=1000,tpot_ms=50 (default: none)")
    c.add_argument("--text-prompts", metavar="TOKENIZER", nargs="?", const="default",
                   help="send each prompt as the text its ids decode to with this tokenizer (an HF folder or .gguf; "
                        "'default': the default model's), for servers that take only text (default: token ids)")
    c.add_argument("--no-ignore-eos", action="store_true",
                   help="let requests stop at eos (default: ignore it, so outputs have the workload's lengths)")
    c.add_argument("--timeout", type=float, default=600.0, action=Bounded, above=0,
                   help="seconds one request may take (default: %(default)s)")
    c.add_argument("--time-limit", type=float, action=Bounded, above=0, metavar="SECONDS",
                   help="end the replay this many seconds after it starts: requests still running count as "
                        "errors 'time limit', those not sent yet as 'not sent'; the report covers the rest "
                        "(default: none)")
    c.add_argument("--client-processes", type=int, default=1, action=Bounded, at_least=1, metavar="N",
                   help="send from N processes (request i from process i mod N, one common start): one process "
                        "falls behind at thousands of streamed tokens a second (default: %(default)s)")
    c.add_argument("--idle-connections", type=int, default=0, action=Bounded, at_least=0, metavar="N",
                   help="hold N connections open that send nothing during the replay, and report when the server "
                        "closed them (default: %(default)s)")
    c.add_argument("--trickling-connections", type=int, default=0, action=Bounded, at_least=0, metavar="N",
                   help="hold N connections that send a request line one byte a second and never end its headers "
                        "(default: %(default)s)")
    c.add_argument("--oversized-rate", type=float, default=0.0, action=Bounded, at_least=0, metavar="R",
                   help="send R chat requests a second during the replay that no context can fit (240,000 "
                        "one-character messages, 8 MB), and report how the server answered them and how fast "
                        "(default: none)")
    c.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    c.add_argument("--json", metavar="PATH", help="also write the summary and every request as JSON")
    sv.set_defaults(func=_serve)

    lv = kinds.add_parser("live", help="the same replay on the engine in process (no HTTP): engine-side latency")
    _add_workload_source(lv)
    add_engine_args(lv)
    lv.add_argument("--trace", default="out/bench_live/live.jsonl", help="the run's event log (default: %(default)s)")
    lv.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                    help="warm up first, as the server does (default: on CUDA)")
    lv.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    lv.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
    lv.set_defaults(func=_live)
