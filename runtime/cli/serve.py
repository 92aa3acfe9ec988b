"""``minivllm serve``: the OpenAI-compatible HTTP server over one engine (optionally recording its log)."""

from __future__ import annotations

import argparse
import sys

from runtime.cli.config_flags import add_engine_args, engine_options, flag_error


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="model id clients send (default: the model file's name)")
    p.add_argument("--trace", metavar="PATH", help="record the event log of everything served (JSONL, .gz ok)")
    p.add_argument("--max-pending", type=int, default=1024, help="queued requests before answering 429")
    p.set_defaults(func=run)


def build_app(args: argparse.Namespace):
    """Load the engine and build the app; returns (app, engine, close) — close() stops and flushes."""
    from runtime.engine.config import ConfigError
    from runtime.serving.async_engine import AsyncLLMEngine
    from runtime.serving.llm_engine import LLMEngine
    from runtime.serving.server.app import create_app

    if args.max_pending < 1:
        raise flag_error(ValueError("max_pending must be >= 1"), {"max_pending": "--max-pending"})
    try:
        llm_engine = LLMEngine(args.model, trace=args.trace, **engine_options(args))
    except ConfigError as e:
        raise flag_error(e) from None
    tokenizer = llm_engine.tokenizer
    if tokenizer is None:
        raise flag_error(ValueError("--model: this model has no tokenizer; the server needs one"))
    writer = llm_engine.writer
    engine = AsyncLLMEngine(llm_engine, max_pending=args.max_pending,
                            on_step=(lambda _: writer.flush()) if writer is not None else None)
    name = args.served_model_name or llm_engine.parts.loaded.identity.split("@")[0].removesuffix(".gguf")
    app = create_app(engine, tokenizer, name)
    engine.start()

    def close() -> None:
        engine.shutdown()
        llm_engine.close()

    return app, engine, close


def run(args: argparse.Namespace) -> int:
    import uvicorn

    app, engine, close = build_app(args)
    print(f"minivllm: serving {app.state.server.model_name!r} on http://{args.host}:{args.port}/v1"
          + (f"; recording {args.trace}" if args.trace else ""), file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        close()
    return 0
