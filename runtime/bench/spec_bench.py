"""``minivllm bench spec``: speculative decoding against plain decoding, side by side in one run.

Two chat workloads on the model's own template: *repetitive* (each request asks to repeat a
passage of public-domain prose word for word: what prompt lookup is for) and *open* (a short
story on a topic: little to look up). Per workload and batch size (requests arriving at once,
greedy, eos honoured, the same output-token cap), the engine runs without speculation, then with
``--speculative``; greedy output must come out identical (it is checked). With ``--acceptance
RATES`` it also runs a drafter of controlled acceptance: it proposes the plain run's own next
tokens, each one kept with probability RATE and replaced by a wrong token otherwise, so the
system's speed is measured apart from how well a real drafter guesses (random weights included).

Figures: output tokens per second, the speed-up over plain, drafts accepted / proposed, tokens
committed per speculating round, steps. With a cost model, each run's event log is re-simulated
(runtime/bench/spec_sim.py) and the speed-up the simulator predicts stands beside the live one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runtime.bench import spec_sim
from runtime.engine.drafters import ThrottledDrafter, parse_speculative
from runtime.executor.heap import frozen_heap
from traces.events import Step
from traces.log import LogWriter
from traces.params import SamplingParams
from traces.speculation import rounds

PASSAGES = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair.",
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great "
    "civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure.",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, "
    "and nothing particular to interest me on shore, I thought I would sail about a little and see the "
    "watery part of the world.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering "
    "a neighbourhood, this truth is so well fixed in the minds of the surrounding families.",
)
TOPICS = ("a lighthouse keeper who finds a map", "a robot learning to paint", "a city that floats on a lake",
          "two rivals stranded on a mountain", "a baker who can hear thoughts", "the last train of the night",
          "a garden that grows in winter", "a detective who is afraid of the dark")
WORKLOADS = ("repetitive", "open")
# the draft "model" a replay drafter's runs are logged with (model:replay:K): it stands for a draft
# model served as one is (throttled, the next step planned ahead while no drafts may come), and a
# re-simulation of its log runs it that way. Only simulations read these logs: no model of that path
# is ever loaded (run_once passes the drafter itself)
REPLAY = "replay"


def messages(workload: str, i: int) -> list[dict[str, str]]:
    if workload == "repetitive":
        passage = PASSAGES[i % len(PASSAGES)]
        return [{"role": "user", "content": f"Repeat the following passage exactly, word for word:\n\n{passage}"}]
    return [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."}]


def encode_prompts(tokenizer, workload: str, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = tokenizer.apply_chat_template(messages(workload, i), tokenize=False, add_generation_prompt=True)
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


class ReplayDrafter:
    """Proposes a plain run's own next tokens (``outputs[request id]``), each kept with probability
    ``rate`` (seeded by request and position) and replaced by the next id otherwise: acceptance
    under control, whatever the weights. The proposals are drawn up front, so proposing costs a
    list slice a request, less than the ngram drafter's lookup: the measured step times are the
    engine's, not this instrument's. Measured as a draft model is served: throttled by how many of
    each request's drafts are kept (``ThrottledDrafter``)."""

    def __init__(self, outputs: Sequence[Sequence[int]], num_tokens: int, rate: float, vocab: int,
                 seed: int = 0) -> None:
        self.num_tokens = num_tokens
        self.proposals = [[t if _keep(seed, rid, i, rate) else (t + 1) % vocab for i, t in enumerate(out)]
                          for rid, out in enumerate(outputs)]

    def propose(self, requests, limits) -> list[list[int]]:
        proposals = self.proposals
        return [proposals[req.request_id][req.num_output_tokens:req.num_output_tokens + n]
                for req, n in zip(requests, limits)]


def _keep(seed: int, request_id: int, position: int, rate: float) -> bool:
    h = hashlib.blake2b(f"{seed}/{request_id}/{position}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") < rate * 2**64


@dataclass
class SpecRun:
    workload: str
    batch: int
    drafter: str  # "off", the --speculative value, or "replay@RATE"
    seconds: float
    output_tokens: int
    steps: int
    rounds: int  # speculating spans
    proposed: int
    accepted: int
    identical: bool | None = None  # greedy output equal to the plain run's (None: the plain run itself)
    repeat_seconds: list[float] = field(default_factory=list)  # every repeat's (the first: ``seconds``)
    speedups: list[float] = field(default_factory=list)  # per repeat, over the plain run of the same repeat
    sim_seconds: float | None = None  # the simulated makespan (with a cost model)
    sim_steps: int | None = None
    sim_speedup: float | None = None  # simulated plain makespan / this run's

    def __post_init__(self) -> None:
        self.repeat_seconds = self.repeat_seconds or [self.seconds]

    @property
    def tok_s(self) -> float:
        """At the median repeat's time."""
        seconds = statistics.median(self.repeat_seconds)
        return self.output_tokens / seconds if seconds else 0.0

    @property
    def speedup(self) -> float | None:
        """The median of the repeats' speed-ups."""
        return statistics.median(self.speedups) if self.speedups else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def tokens_per_round(self) -> float | None:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else None

    @property
    def sim_error(self) -> float | None:
        """Predicted speed-up / live speed-up - 1."""
        return self.sim_speedup / self.speedup - 1 if self.sim_speedup and self.speedup else None

    def as_json(self) -> dict:
        return {**asdict(self), "tok_s": self.tok_s, "speedup": self.speedup, "acceptance": self.acceptance,
                "tokens_per_round": self.tokens_per_round, "sim_error": self.sim_error}


def run_once(parts, prompts: list[list[int]], max_tokens: int, speculative: str, drafter=None,
             label: str | None = None, workload: str = "", log: Path | None = None) -> tuple[SpecRun, list[list[int]]]:
    """All ``prompts`` at once, greedy, until done; returns the run and each request's output.
    ``log``: where to write the run's event log (after the run: no file writes in the timed loop)."""
    events: list = []
    parts = dataclasses.replace(parts, config=dataclasses.replace(parts.config, speculative=speculative))
    core = parts.core(sink=events.append, drafter=drafter)  # None: the config's own, built as serve builds it
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    for p in prompts:
        core.add_request(p, params, 0.0)
    outputs: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    with frozen_heap():  # no full collection inside the timed run (the server runs so too)
        t0 = time.perf_counter()
        loop = parts.loop(core, lambda: time.perf_counter() - t0)
        while core.has_unfinished() or loop.busy:
            for out in loop.step():
                for d in out.deltas:
                    outputs[d.request_id].extend(d.new_token_ids)
        seconds = time.perf_counter() - t0
    parts.runner.reset()
    if log is not None:
        with LogWriter(log) as write:
            write(parts.header())
            for event in events:
                write(event)
    steps = [e for e in events if isinstance(e, Step)]
    r = [x for s in steps for x in rounds(s)]
    run = SpecRun(workload, len(prompts), label or speculative or "off", seconds,
                  sum(map(len, outputs.values())), len(steps), len(r), sum(p for _, p, _ in r),
                  sum(a for _, _, a in r))
    return run, [outputs[i] for i in range(len(prompts))]


def run(model: str | None, *, speculative: str, batches: Sequence[int] = (1, 8),
        workloads: Sequence[str] = WORKLOADS, max_tokens: int = 128, acceptance: Sequence[float] = (),
        tokenizer: str | None = None, cost_model=None, log_dir: str | Path | None = None, repeats: int = 1,
        **options) -> list[SpecRun]:
    """``cost_model``: also re-simulate every run's log with it (the predicted speed-ups);
    ``log_dir``: keep the logs there (default: a temporary folder, and only with a cost model);
    ``repeats``: times each run is timed (the figures: the medians, and the speed-ups' range)."""
    from runtime.executor.setup import build_engine

    spec = parse_speculative(speculative)
    k = spec.num_tokens if spec is not None else 4
    print("loading the model …", file=sys.stderr, flush=True)
    parts = build_engine(model, tokenizer=tokenizer, **options)
    tok = parts.loaded.tokenizer
    vocab = parts.loaded.spec.vocab_size
    results: list[SpecRun] = []
    warm = encode_prompts(tok, "open", 2)
    run_once(parts, warm, 8, "")  # untimed: kernels and allocator warmed on both paths
    run_once(parts, warm, 8, speculative or "ngram:4")
    with _log_dir(log_dir, cost_model is not None) as logs:
        for workload in workloads:
            for batch in batches:
                prompts = encode_prompts(tok, workload, batch)
                log = _log_path(logs, workload, batch, "off")
                plain, outputs = run_once(parts, prompts, max_tokens, "", workload=workload, log=log)
                if cost_model is not None:
                    _simulate(plain, log, cost_model)
                tries = [(speculative, None, None)] if speculative else []
                tries += [(f"model:{REPLAY}:{k}", ThrottledDrafter(ReplayDrafter(outputs, k, rate, vocab)),
                           f"replay@{rate:g}:{k}") for rate in acceptance]
                runs, run_logs = [], []
                for value, drafter, label in tries:
                    print(f"{workload}, batch {batch}: {label or value} …", file=sys.stderr, flush=True)
                    log = _log_path(logs, workload, batch, label or value)
                    r, out = run_once(parts, prompts, max_tokens, value, drafter, label, workload, log)
                    r.identical = out == outputs
                    runs.append(r)
                    run_logs.append(log)
                for _ in range(repeats - 1):  # interleaved, so a drift of the machine's speed reaches every drafter
                    plain.repeat_seconds.append(run_once(parts, prompts, max_tokens, "")[0].seconds)
                    for r, (value, drafter, label) in zip(runs, tries):
                        r.repeat_seconds.append(run_once(parts, prompts, max_tokens, value, drafter, label)[0].seconds)
                for r, log in zip(runs, run_logs):
                    r.speedups = [p / s for p, s in zip(plain.repeat_seconds, r.repeat_seconds)]
                    if cost_model is not None:
                        _simulate(r, log, cost_model, plain)
                results += [plain, *runs]
    return results


def _simulate(r: SpecRun, log: Path, cost_model, plain: SpecRun | None = None) -> None:
    """``r``'s simulated makespan and steps and, beside ``plain``'s, its predicted speed-up."""
    r.sim_seconds, r.sim_steps = spec_sim.simulated(log, cost_model, drafted=r.rounds > 0)
    if plain is not None and plain.sim_seconds and r.sim_seconds:
        r.sim_speedup = plain.sim_seconds / r.sim_seconds


@contextlib.contextmanager
def _log_dir(log_dir: str | Path | None, needed: bool) -> Iterator[Path | None]:
    """Where the runs' logs go: ``log_dir``, else a temporary folder when they are ``needed``, else nowhere."""
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        yield Path(log_dir)
    elif needed:
        with tempfile.TemporaryDirectory(prefix="bench-spec-") as tmp:
            yield Path(tmp)
    else:
        yield None


def _log_path(logs: Path | None, workload: str, batch: int, drafter: str) -> Path | None:
    """``repetitive-b8-ngram_4.jsonl``: one log per run, named by what it ran."""
    return None if logs is None else logs / f"{workload}-b{batch}-{re.sub(r'[^A-Za-z0-9.]+', '_', drafter)}.jsonl"


def _spread(values: list[float]) -> str:
    return f" ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else ""


def table(results: list[SpecRun]) -> str:
    head = ("workload", "batch", "drafter", "tok/s", "speed-up", "accepted", "tok/round", "steps", "same output")
    simulated = any(r.sim_seconds is not None for r in results)
    if simulated:
        head += ("sim speed-up", "sim error")
    rows = []
    for r in results:
        row = (r.workload, str(r.batch), r.drafter, f"{r.tok_s:.1f}",
               "" if r.speedup is None else f"{r.speedup:.2f}×" + _spread(r.speedups),
               "" if r.acceptance is None else f"{r.acceptance:.0%} of {r.proposed}",
               "" if r.tokens_per_round is None else f"{r.tokens_per_round:.2f}", str(r.steps),
               "" if r.identical is None else ("yes" if r.identical else "NO"))
        if simulated:
            row += ("" if r.sim_speedup is None else f"{r.sim_speedup:.2f}×",
                    "" if r.sim_error is None else f"{r.sim_error:+.1%}")
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)
