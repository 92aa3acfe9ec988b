"""``minivllm serve``: the OpenAI-compatible HTTP server over one engine (optionally recording its log).

If the engine stops on its own (its process killed or crashed, a step raising), the server does
not linger answering 503: open streams end with an error event, then it shuts down and exits with
``ENGINE_DIED_STATUS``, for a supervisor (systemd, Kubernetes, a shell loop) to start it afresh.
A fresh process is the only restart that leaves nothing of the failure behind (GPU memory, a
half-written step); the log of the run that died stays whole up to its last step.

A fleet (``--data-parallel-size N``) outlives a replica: the dead replica's requests fail, the
others go on, and it is started again, a fresh process, up to ``--replica-restarts`` times after a
back-off that doubles from ``--replica-restart-backoff``. The server exits only once every replica
is down for good.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from runtime.cli.checks import Bounded, BoundedOrAuto, int_or_auto
from runtime.cli.config_flags import add_engine_args, announce_load, engine_options, flag_error
from runtime.cli.errors import CLIError
from runtime.engine.routers import ROUTERS
from runtime.executor.heap import freeze_heap
from traces.log import IF_EXISTS
from traces.prompt import TRACE_PROMPTS

API_KEY_ENV = "VLLM_API_KEY"  # vLLM's: scripts written for it keep working
ENGINE_DIED_STATUS = 1  # the exit status after the engine stopped on its own
SHUTDOWN_GRACE_S = 10  # how long responses in progress get to end once the engine is gone
# serve's flags that shape its HTTP front end or its log only, with the values each takes: an in-process
# run of the same engine (``bench live`` beside a served run) has none of them
FRONT_END_FLAGS = {"--host": 1, "--port": 1, "--served-model-name": 1, "--api-key": 1, "--engine-process": 0,
                   "--no-engine-process": 0, "--api-server-count": 1, "--max-pending": 1, "--max-request-bytes": 1,
                   "--trace-prompts": 1, "--trace-if-exists": 1, "--timeout-keep-alive": 1, "--timeout-header": 1}


def engine_flags(flags: list[str]) -> list[str]:
    """``flags`` (serve's) less ``FRONT_END_FLAGS`` and their values."""
    out, skip = [], 0
    for flag in flags:
        if skip:
            skip -= 1
        elif flag.split("=", 1)[0] in FRONT_END_FLAGS:
            skip = 0 if "=" in flag else FRONT_END_FLAGS[flag]
        else:
            out.append(flag)
    return out


def register(sub: argparse._SubParsersAction) -> None:
    from runtime.serving.replica_restarts import DEFAULT_BACKOFF_S, DEFAULT_RESTARTS
    from runtime.serving.server.app import DEFAULT_MAX_REQUEST_BYTES
    from runtime.serving.server.connections import DEFAULT_TIMEOUTS

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)")
    p.add_argument("model_arg", nargs="?", metavar="MODEL",
                   help="the model, as with --model (`vllm serve MODEL`) (default: --model's)")
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    g.add_argument("--port", type=int, default=8000, action=Bounded, at_least=0, below=65536,
                   help="port to listen on; 0: any free one (default: %(default)s)")
    g.add_argument("--served-model-name", help="model id clients send (default: the model file's name)")
    g.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every path but /health, /ready and /metrics "
                        f"(default: ${API_KEY_ENV} if set, else no key)")
    g.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=None,
                   help="before /ready answers 200, run the step shapes serving can hit, so no kernel compiles "
                        "while serving (default: on CUDA; the CPU path compiles nothing)")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine in a process of its own, so HTTP work never competes with the step "
                        "loop for one GIL (off: on a thread of the server's process) (default: %(default)s)")
    g.add_argument("--data-parallel-size", type=int, default=1, action=Bounded, at_least=1, metavar="N",
                   help="engine replicas behind this front door, each in a process of its own (a GPU each when "
                        "there are N, else sharing one); with --trace, PATH is the fleet log of routing "
                        "decisions and each replica's log goes beside it (default: %(default)s)")
    g.add_argument("--replica-restarts", type=int, default=DEFAULT_RESTARTS, action=Bounded, at_least=0, metavar="N",
                   help="with --data-parallel-size: times each replica is started again after its engine process "
                        "dies (its requests in flight fail, the others go on); 0: it stays down (default: "
                        "%(default)s)")
    g.add_argument("--replica-restart-backoff", type=float, default=DEFAULT_BACKOFF_S, action=Bounded, above=0,
                   metavar="S", help="seconds before a replica's first restart; each next one waits twice as long "
                                     "(default: %(default)s)")
    g.add_argument("--api-server-count", type=int_or_auto, default="auto", action=BoundedOrAuto, at_least=1,
                   metavar="N|auto",
                   help="HTTP front-end processes on the port, over one engine process: one process's event loop "
                        "falls behind at thousands of streamed tokens a second (each front end's /metrics shows "
                        "the whole engine; its 429 count is its own); auto: one per 4 cores, 1 to 4 (1 with "
                        "--no-engine-process or --data-parallel-size) (default: %(default)s)")
    g.add_argument("--router", choices=list(ROUTERS), default="round-robin",
                   help="which replica takes a request (the simulator's routers) (default: %(default)s)")
    g.add_argument("--max-pending", type=int, default=1024, action=Bounded, at_least=1, metavar="N",
                   help="queued requests before answering 429 (default: %(default)s)")
    g.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, action=Bounded, at_least=1,
                   metavar="N", help="largest request body; a larger one gets 413 (default: %(default)s = 8 MiB)")
    g.add_argument("--timeout-keep-alive", type=float, default=DEFAULT_TIMEOUTS.keep_alive_s, action=Bounded,
                   above=0, metavar="S", help="close a kept-alive connection idle this long after a response "
                                              "(default: %(default)s)")
    g.add_argument("--timeout-header", type=float, default=DEFAULT_TIMEOUTS.header_s, action=Bounded, above=0,
                   metavar="S", help="close a connection whose request line and headers are not all in this long "
                                     "after it opened or after its previous response: idle and trickling clients "
                                     "hold no socket for good (default: %(default)s)")
    t = p.add_argument_group("event log")
    t.add_argument("--trace", metavar="PATH",
                   help="record the event log of everything served (JSONL, .gz ok) (default: no log)")
    t.add_argument("--trace-prompts", choices=TRACE_PROMPTS, default="ids",
                   help="what the log keeps of each prompt: its token ids, its block hashes (enough to "
                        "replay prefix caching, not the text) or its length only (default: %(default)s)")
    t.add_argument("--trace-if-exists", choices=IF_EXISTS, default="rotate",
                   help="an earlier log at PATH: rotate it to PATH's next numbered name, refuse to start, "
                        "or overwrite it (default: %(default)s)")
    p.set_defaults(func=run)


def _announcer(args: argparse.Namespace):
    """The on-ready callback: says "ready", with the warm-up's and the whole start's seconds."""
    started = args.started  # set by ``run``, or by ``build_app`` when called alone

    def announce(report) -> None:
        done = f"warmed up in {report.seconds:.1f} s ({report.steps} steps); " if report is not None else ""
        print(f"minivllm: {done}ready {time.monotonic() - started:.1f} s after start", file=sys.stderr, flush=True)

    return announce


def resolve_api_key(flag: str | None) -> str | None:
    """--api-key, else $VLLM_API_KEY, else None (no key)."""
    return flag or os.environ.get(API_KEY_ENV) or None


def resolve_api_server_count(args: argparse.Namespace, cores: int | None = None) -> int:
    """``--api-server-count``, ``auto`` resolved (runtime/serving/server/front_ends.py, ``auto_count``):
    1 where front ends cannot share the engine (no engine process, or a fleet behind the door)."""
    if args.api_server_count != "auto":
        return args.api_server_count
    if not args.engine_process or args.data_parallel_size > 1:
        return 1
    from runtime.serving.server.front_ends import auto_count, machine_cores

    return auto_count(machine_cores() if cores is None else cores)


def intake_workers(args: argparse.Namespace) -> int:
    from runtime.serving.server.front_ends import machine_cores
    from runtime.serving.server.intake import worker_count

    return worker_count(machine_cores(), args.api_server_count)


def build_app(args: argparse.Namespace, on_dead=None):
    """Start the engine and build the app; returns (app, engine, close) — close() stops the engine
    and flushes its log. ``on_dead(reason)``: called once if the engine stops on its own."""
    from runtime.engine.config import ConfigError
    from runtime.serving.server.app import create_app

    if args.api_server_count == "auto":  # (``run`` resolves it: other callers start no more front ends)
        args.api_server_count = 1
    if getattr(args, "started", None) is None:  # (``run`` sets it at its own start)
        args.started = time.monotonic()

    if args.data_parallel_size > 1 and not args.engine_process:
        raise CLIError("--data-parallel-size: the replicas run in engine processes (drop --no-engine-process)")
    if args.api_server_count > 1 and (not args.engine_process or args.data_parallel_size > 1):
        raise CLIError("--api-server-count: more front ends share one engine process (drop "
                       + ("--no-engine-process)" if not args.engine_process else "--data-parallel-size)"))
    announce_load(args.model)
    options = dict(model=args.model, trace=args.trace, trace_prompts=args.trace_prompts,
                   if_exists=args.trace_if_exists, tokenizer=args.tokenizer, **engine_options(args))
    start = (_data_parallel if args.data_parallel_size > 1
             else _engine_process if args.engine_process else _engine_thread)
    try:
        engine, tokenizer, close = start(args, options)
    except ConfigError as e:
        raise flag_error(e) from None
    except FileExistsError as e:
        raise CLIError(f"--trace-if-exists error: {e} (rotate or overwrite it, or choose another --trace)") from None
    if tokenizer is None:
        close()
        raise flag_error(ValueError("--model: this model has no tokenizer; the server needs one"))
    name = args.served_model_name or engine.model_identity.split("@")[0].removesuffix(".gguf")
    app = create_app(engine, tokenizer, name, api_key=resolve_api_key(args.api_key),
                     max_request_bytes=args.max_request_bytes, intake_workers=intake_workers(args))
    engine.on_dead = on_dead
    engine.start()

    def close_all() -> None:
        app.state.server.close()
        close()

    return app, engine, close_all


def _engine_process(args: argparse.Namespace, options: dict):
    """The engine in a child process (the default): this one never imports torch."""
    from runtime.serving.async_engine import AsyncLLMEngine
    from runtime.serving.engine_main import EngineSpec
    from runtime.serving.engine_process import EngineProcess

    process = EngineProcess(EngineSpec(kwargs=options, warmup=args.warmup), front_ends=args.api_server_count)
    engine = AsyncLLMEngine(connection=process, max_pending=args.max_pending, on_ready=_announcer(args),
                            front_ends=args.api_server_count)
    return engine, process.tokenizer(), engine.shutdown


def _data_parallel(args: argparse.Namespace, options: dict):
    """N engine processes behind one front door (runtime/serving/data_parallel.py)."""
    import time

    from runtime.serving.async_engine import AsyncLLMEngine
    from runtime.serving.data_parallel import DataParallelEngine, replica_engine
    from runtime.serving.engine_main import EngineSpec
    from runtime.serving.engine_process import EngineProcess
    from runtime.serving.replica_restarts import RestartPolicy
    from traces.events import make_header
    from traces.fleet_log import fleet_extra, relative_log, replica_log_path, restart_log_path
    from traces.log import LogWriter

    n, trace = args.data_parallel_size, options.pop("trace")
    logs = [replica_log_path(trace, i) for i in range(n)] if trace else []
    route_log = LogWriter(trace, if_exists=args.trace_if_exists) if trace else None
    origin = time.monotonic()  # the replicas' logs share one time axis

    def start_replica(i: int, restart: int = 0) -> tuple[AsyncLLMEngine, str | None]:
        """Replica i's engine process (after its ``restart``-th restart: a log of its own)."""
        log = (logs[i] if restart == 0 else restart_log_path(trace, i, restart)) if trace else None
        kwargs = {**options, "trace": str(log) if log else None, "clock_origin": origin, "replica": i, "replicas": n}
        process = EngineProcess(EngineSpec(factory=replica_engine, kwargs=kwargs, warmup=args.warmup),
                                name=f"replica {i}")
        engine = AsyncLLMEngine(connection=process, max_pending=args.max_pending)
        return engine, relative_log(log, trace) if log else None

    replicas: list[AsyncLLMEngine] = []
    try:
        for i in range(n):
            replicas.append(start_replica(i)[0])
    except BaseException:
        for r in replicas:
            r.shutdown()
        if route_log is not None:
            route_log.close()
        raise
    if route_log is not None:
        route_log(make_header(replicas[0].config, clock="wall",
                              extra=fleet_extra(args.router, logs, trace, data_parallel=True)))
    engine = DataParallelEngine(replicas, args.router, route_log=route_log, restart=start_replica,
                                policy=RestartPolicy(args.replica_restarts, args.replica_restart_backoff))
    _announce_when_ready(engine, _announcer(args))
    tokenizer = replicas[0].connection.tokenizer()

    def close() -> None:
        engine.shutdown()
        if route_log is not None:
            route_log.close()

    return engine, tokenizer, close


def _announce_when_ready(engine, announce) -> None:
    """Say "ready" once every replica is warmed up."""
    import threading

    threading.Thread(target=lambda: (engine.ready.wait(), announce(None)), daemon=True).start()


def _engine_thread(args: argparse.Namespace, options: dict):
    """The engine on a thread of this process (--no-engine-process)."""
    from runtime.serving.async_engine import AsyncLLMEngine
    from runtime.serving.engine_main import announce_build
    from runtime.serving.llm_engine import LLMEngine

    llm_engine = LLMEngine(**options)
    warmup = args.warmup if args.warmup is not None else llm_engine.parts.runner.device.type == "cuda"
    announce_build(llm_engine.parts, warmup)
    engine = AsyncLLMEngine(llm_engine, max_pending=args.max_pending, warmup=warmup, on_ready=_announcer(args))

    def close() -> None:
        engine.shutdown()
        llm_engine.close()

    return engine, llm_engine.tokenizer, close


def resolve_model(args: argparse.Namespace) -> str | None:
    """The model: MODEL or --model (vLLM takes either); both is an error."""
    if args.model_arg is not None and args.model is not None:
        raise CLIError(f"--model: the model is given twice, as MODEL ({args.model_arg}) and as --model "
                       f"({args.model}); give one")
    return args.model_arg if args.model_arg is not None else args.model


def run(args: argparse.Namespace) -> int:
    from runtime.cli.listen import bind
    from runtime.serving.server.connections import raise_open_files_limit
    from runtime.serving.server.launch import http_server

    args.started = time.monotonic()
    args.model = resolve_model(args)
    args.api_server_count = resolve_api_server_count(args)
    raise_open_files_limit()  # (inherited by the engine and front-end processes)
    # before the model loads: a taken port is an error at once
    sock = bind(args.host, args.port, reuse_port=args.api_server_count > 1)
    died = EngineDeath()
    signal.signal(signal.SIGTERM, died.told_to_stop)
    signal.signal(signal.SIGINT, died.told_to_stop)
    try:
        app, engine, close = build_app(args, on_dead=died)
    except BaseException:
        sock.close()
        raise
    app.state.server.intake.start()
    freeze_heap()  # the start-up heap (tokenizer, FastAPI, pydantic): exempt from collections while serving
    port = sock.getsockname()[1]
    # the model name and the log's path only: never a prompt
    print(f"minivllm: serving {app.state.server.model_name!r} on http://{args.host}:{port}/v1"
          + (f"; recording {args.trace} (prompts: {args.trace_prompts})" if args.trace else "")
          + ("; API key required" if app.state.api_key_required else ""), file=sys.stderr)
    server = http_server(app, args.host, port, SHUTDOWN_GRACE_S, timeouts(args))
    died.stop(server)
    front_ends = _more_front_ends(args, app, engine, port, died)
    try:
        if not died.reason:
            server.run(sockets=[sock])  # as uvicorn.run, on the socket bound above
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM: uvicorn has shut down; so does the engine, below
        pass
    finally:
        if front_ends is not None:
            front_ends.stop(SHUTDOWN_GRACE_S + 5)
        close()
        sock.close()
    if died.reason and not died.stopping:  # (an engine that ends with a Ctrl-C to the process group is no death)
        return ENGINE_DIED_STATUS
    if died.stopping == signal.SIGINT:
        return 130
    return 0 if server.started else 3  # 3: uvicorn's exit status for a server that never started


def timeouts(args: argparse.Namespace):
    from runtime.serving.server.connections import Timeouts

    return Timeouts(args.timeout_keep_alive, args.timeout_header)


def _more_front_ends(args: argparse.Namespace, app, engine, port: int, died):
    """Front ends 1..N-1 of ``--api-server-count N`` (runtime/serving/server/front_ends.py), or None."""
    if args.api_server_count == 1:
        return None
    from runtime.serving.server.front_ends import FrontEnds, FrontEndSpec

    spec = FrontEndSpec(args.host, port, app.state.server.model_name, resolve_api_key(args.api_key),
                        args.max_request_bytes, args.max_pending, SHUTDOWN_GRACE_S, timeouts=timeouts(args),
                        intake_workers=intake_workers(args))
    front_ends = FrontEnds(engine.connection, spec, died)
    app.state.server.others_listening = front_ends.all_listening  # (before front end 0 listens)
    return front_ends


class EngineDeath:
    """``on_dead`` of the server's engine: says so on stderr and stops the HTTP server (from the
    connection's thread; uvicorn polls ``should_exit``)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.stopping: int | None = None  # the signal that asked the server to stop
        self._server = None

    def told_to_stop(self, signum: int, frame) -> None:
        """SIGINT or SIGTERM: stop serving. While the model loads, at once; once the HTTP server exists,
        it is asked to stop (an exception raised from a handler could land in any callback, a spawn
        of a front end among them); uvicorn shuts down gracefully, then raises the signal again under
        the handler it found, this one, and the engine is stopped, its log closed."""
        self.stopping = signum
        if self._server is not None:
            self._server.should_exit = True
            return
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(0)

    def __call__(self, reason: str) -> None:
        if self.reason is not None or self.stopping:  # (each replica of a data-parallel server reports its own)
            return
        self.reason = reason
        print(f"minivllm: {reason}; shutting down (exit status {ENGINE_DIED_STATUS}) so a supervisor can start "
              "the server afresh", file=sys.stderr, flush=True)
        if self._server is not None:
            self._server.should_exit = True

    def stop(self, server) -> None:
        """The HTTP server to stop (it may already have been asked: then it never starts)."""
        self._server = server
