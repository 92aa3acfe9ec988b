"""``minivllm demo``: the main job end to end on the default model, on this machine.

1. serve   — the OpenAI-compatible server on SmolLM2, recording its event log, under a seeded
             mix of live clients (short chats, streamed and not, plus long-document questions
             that share a prefix), all through the official ``openai`` client;
2. fit     — a step-time cost model from that live log (or ``--cost-model M``: a profile's, so the
             live run is judged by a model it had no part in);
3. replay  — fidelity: timing-replay of the recorded decisions and re-simulation of the workload
             (the cost model's error), and execute-replay of the recorded batches on the real
             runtime (tokens must match the log);
4. what-if — the recorded workload re-simulated with chunked prefill on and off, and the same
             change over ``--draws`` redrawings of its arrivals (a short run's tail is a few requests);
5. analyze — the what-if first (chunked off against on, both simulated from the same model over
             the draws, a change counted when it passes 5 % the same way on most draws, the
             model's error beside it), then the live run against its simulation (the model's
             own error) on a line of its own: report.md, latency CDFs, timeline, Chrome traces.

Every stage is also a ``minivllm`` command; the demo prints each one as it runs it.
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.cli.checks import Bounded

_SENTENCES = [
    "The river town of Alder Reach grew up around a stone bridge built by salt traders.",
    "Every spring the lower market floods, and the merchants move their stalls to the old granary.",
    "The granary was converted into a library after the great harvest failure of the ninth year.",
    "Its reading room holds maps of every trade road between the coast and the northern passes.",
    "Ferrymen still charge a copper coin per crossing, although the bridge has been free for decades.",
    "A council of seven families decides how the tolls from the river locks are spent.",
    "Most of the money repairs the lock gates, which swell and crack in the winter cold.",
    "Children learn to swim in the shallow millpond behind the weavers' hall.",
    "The weavers are famous for a blue dye made from a marsh plant that grows nowhere else.",
    "Travelers often arrive for the autumn fair, when the whole town smells of smoked fish and cider.",
    "The eastern road was paved only recently, with stones taken from a collapsed watchtower.",
    "Local stories claim the watchtower was abandoned after a lantern fire spread to its roof.",
]

_QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for learning to cook.",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "What is 17 times 3?",
    "Name four planets of the solar system.",
    "How do I make a cup of green tea?",
    "Why is the sky blue?",
    "Suggest a name for a small bakery.",
    "What are the primary colors?",
    "Translate 'good morning' into Spanish.",
    "List three uses of a paperclip.",
]

_DOC_QUESTIONS = ["Why does the market move in spring?", "Who decides how the tolls are spent?",
                  "What is the weavers' dye made from?"]


@dataclass(frozen=True)
class DemoRequest:
    arrival: float  # seconds after the start
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float
    seed: int | None
    stream: bool


def demo_workload(num_requests: int, rate: float, seed: int = 0) -> list[DemoRequest]:
    """Poisson arrivals; 1 in 4 requests asks about one of two long documents (shared prefixes)."""
    rng = random.Random(seed)
    docs = []
    for d in range(2):
        r = random.Random(100 + d)
        docs.append(" ".join(r.choice(_SENTENCES) for _ in range(40)))
    out, t = [], 0.0
    for i in range(num_requests):
        t += rng.expovariate(rate)
        sampled = rng.random() < 0.3
        if i % 4 == 3:
            doc = docs[(i // 4) % 2]
            content = f"Read this text.\n\n{doc}\n\nQuestion: {rng.choice(_DOC_QUESTIONS)}"
            max_tokens = 24
        else:
            content = rng.choice(_QUESTIONS)
            max_tokens = rng.choice([24, 48, 64])
        out.append(DemoRequest(round(t, 3), [{"role": "user", "content": content}], max_tokens,
                               0.8 if sampled else 0.0, rng.randrange(1 << 30) if sampled else None,
                               stream=rng.random() < 0.5))
    return out


def _client_load(base_url: str, workload: list[DemoRequest], model: str) -> list[str]:
    """Send the workload at its arrival times from one thread per request; returns the answers."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    answers = [""] * len(workload)
    errors: list[BaseException] = []
    t0 = time.monotonic()

    def send(i: int, req: DemoRequest) -> None:
        time.sleep(max(0.0, req.arrival - (time.monotonic() - t0)))
        try:
            kwargs = dict(model=model, messages=req.messages, max_tokens=req.max_tokens,
                          temperature=req.temperature, seed=req.seed)
            if req.stream:
                answers[i] = "".join(c.choices[0].delta.content or "" for c in
                                     client.chat.completions.create(stream=True, **kwargs) if c.choices)
            else:
                answers[i] = client.chat.completions.create(**kwargs).choices[0].message.content
        except BaseException as e:  # reported after the join
            errors.append(e)

    threads = [threading.Thread(target=send, args=(i, r)) for i, r in enumerate(workload)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"{len(errors)} demo requests failed; first: {errors[0]!r}")
    return answers


def _cli(argv: list[str]) -> None:
    from runtime.cli import main

    print(f"\n$ minivllm {shlex.join(argv)}", flush=True)
    rc = main(argv)
    if rc:
        raise SystemExit(rc)


def serve_and_record(out: Path, workload: list[DemoRequest], engine_flags: list[str]) -> Path:
    from runtime.cli import build_parser
    from runtime.cli.serve import build_app
    from runtime.serving.server.launch import ServerThread

    log = out / "live.jsonl"
    argv = ["serve", "--trace", str(log), "--trace-if-exists", "overwrite", *engine_flags]  # the demo owns out/
    print(f"\n$ minivllm {shlex.join(argv)}   # in a thread, with {len(workload)} openai clients", flush=True)
    args = build_parser().parse_args(argv)
    app, _, close = build_app(args)
    model = app.state.server.model_name
    t0 = time.monotonic()
    try:
        with ServerThread(app) as http:
            answers = _client_load(http.url + "/v1", workload, model)
    finally:
        close()
    print(f"served {len(workload)} requests in {time.monotonic() - t0:.1f} s; event log: {log}")
    for req, answer in list(zip(workload, answers))[:3]:
        question = req.messages[0]["content"].splitlines()[-1]
        print(f"  Q: {question[:70]}\n  A: {answer.strip()[:100]!r}")
    return log


def run_demo(args: argparse.Namespace) -> int:
    if args.cost_model:  # a profile of this machine (no live log in it): checked before anything runs
        from runtime.cli import cost_models

        cost_models.load(args.cost_model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = demo_workload(args.requests, args.rate, args.seed)
    engine_flags = ["--max-num-batched-tokens", str(args.max_num_batched_tokens), "--kv-cache-gb", "0.5",
                    "--seed", str(args.seed)]
    live = serve_and_record(out, workload, engine_flags)
    model = args.cost_model
    if model is None:
        model = out / "cost_model.json"
        _cli(["cost-model", "fit", str(live), "--out", str(model)])
    # the model's error on the live run (its decisions re-timed, its workload re-simulated), and the
    # what-if over many draws of the arrivals: 48 requests' p90 alone is one draw's fifth largest
    _cli(["fidelity", str(live), "--cost-model", str(model), "--what-if", "scheduler.enable_chunked_prefill=false",
          "--draws", str(args.draws), "--json", str(out / "fidelity.json"), "--plot", str(out / "fidelity.png")])
    sims = {}
    for chunked in ("on", "off"):
        sims[chunked] = out / f"sim_chunked_{chunked}.jsonl"
        _cli(["simulate", str(live), "--cost-model", str(model), "--chunked", chunked,
              "--out", str(sims[chunked]), "--no-progress"])
    if not args.skip_execute:
        _cli(["replay", str(live), "--execute", "--no-progress"])
    # against the simulated chunked-on run: the what-if (chunking off) over the draws, and apart, the
    # model's error (the live run against its simulation) — the live run as the baseline would show
    # the model's error as the what-if's effect
    _cli(["analyze", str(sims["on"]), str(sims["off"]), str(live), "--what-if", "--draws", str(out / "fidelity.json"),
          "--labels", "sim chunked on,sim chunked off,live (chunked on)", "--chrome-trace",
          "--out", str(out / "report")])
    print(f"\ndemo done: {out / 'report' / 'report.md'}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="serve → record → replay chunked on/off → analyze, on the default model")
    p.add_argument("--out", default="out/demo",
                   help="folder for the logs, cost model and report (default: %(default)s)")
    p.add_argument("--requests", type=int, default=48, action=Bounded, at_least=1,
                   help="number of client requests (default: %(default)s)")
    p.add_argument("--rate", type=float, default=2.0, action=Bounded, above=0,
                   help="mean arrival rate in requests/s (default: %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=64, action=Bounded, at_least=1,
                   help="live token budget, small so the ~750-token documents are chunked over many steps: the "
                        "chunked on/off what-if then moves latencies well past the model's error (default: "
                        "%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the engine (default: %(default)s)")
    p.add_argument("--draws", type=int, default=32, action=Bounded, at_least=1, below=10001,
                   help="redrawings of the arrivals the what-if is measured over (default: %(default)s)")
    p.add_argument("--skip-execute", action="store_true", help="skip the execute-replay stage")
    p.add_argument("--cost-model", metavar="M",
                   help="simulate with this model (e.g. `minivllm profile --fit cpu.json` of this machine, no live "
                        "log in it) instead of one fitted on the demo's own live log")
    p.set_defaults(func=run_demo)
