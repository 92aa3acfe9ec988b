"""A load client for OpenAI-compatible servers: a workload replayed with its arrival times.

Each request is sent at its arrival time (seconds after the run starts) as a streaming
``/v1/completions`` call; the client measures what a user sees: time to the first streamed token
(TTFT), the gaps between streamed chunks (ITL), time per output token after the first (TPOT),
end-to-end latency, and errors by kind; and the response's id (ours names the request in the
server's event log: runtime/bench/serve_join.py pairs by it). Prompts are token ids (exact
lengths; our server and vLLM take them) or text decoded from those ids (``text_prompts``, for
servers that want text). A stream ends at ``data: [DONE]`` or, for servers that send none
(``transformers serve``), when it closes after a chunk with a ``finish_reason``. ``time_limit``
cancels what is still running after that many seconds (errors "time limit", and "not sent" for
arrivals after it), so a slow server costs a bounded run.

A closed-loop workload (``workload sessions``: turns of conversations) is replayed closed loop, as the
simulator runs it: a turn is sent no earlier than its arrival and its think time after the previous
turn of its session has ended (answered or failed); its record's ``arrival`` becomes the time of that release.

``run`` returns one ``RequestRecord`` per request; ``summarize`` turns them into percentiles,
throughput and goodput under SLOs (the share of requests that meet every SLO, per second).

The client must not be what it measures: every body is serialised before the clock starts, HTTP is
the few lines of runtime/bench/http_stream.py (httptools' parser; httpx added 1.3 ms to a light
load's TTFT), events are parsed with msgspec, the loop is uvloop's when installed, and
``--client-processes`` spreads the requests over processes (runtime/bench/serve_shards.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
import numpy as np

from runtime.bench.http_stream import HttpError, HttpStreamClient
from runtime.bench.serve_join import prompt_key
from traces.prompt import materialize
from traces.workload import Workload


@dataclass
class RequestRecord:
    index: int
    arrival: float  # scheduled send time, seconds after the start
    prompt_tokens: int
    max_tokens: int
    sent: float = 0.0  # actual send time
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)  # gaps between streamed chunks
    error: str | None = None  # kind: "http 429", "timeout", "connect", "incomplete", "time limit", ...
    detail: str | None = None  # the error's text: a response body (first 300 characters), an exception
    # closed loop: the request's session, the turn it follows (its index) and the think time after it
    session: int | None = None
    after: int | None = None
    think: float = 0.0
    prompt_key: str | None = None  # the prompt's digest as sent (runtime/bench/serve_join.py), hex
    response_id: str | None = None  # the first chunk's id (ours names the request in the server's log)

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e is not None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft_ms=1000,tpot_ms=50``."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in cls.__dataclass_fields__:
                raise ValueError(f"SLO term {part!r}: expected one of ttft_ms=, tpot_ms=, e2e_ms=")
            try:
                values[key] = float(value)
            except ValueError:
                raise ValueError(f"SLO term {part!r}: {value!r} is not a number") from None
            if values[key] <= 0:
                raise ValueError(f"SLO term {part!r}: must be > 0")
        return cls(**values)

    def met(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        checks = ((self.ttft_ms, r.ttft), (self.tpot_ms, r.tpot), (self.e2e_ms, r.e2e))
        return all(limit is None or (value is not None and value * 1e3 <= limit) for limit, value in checks)


def prompt_ids(spec: Any, vocab: int | None = None) -> list[int]:
    """A workload request's prompt ids, folded into ``[0, vocab)`` when given (equal ids stay equal,
    so shared prefixes stay shared) for a model whose vocabulary is smaller than the trace's."""
    ids = materialize(spec.prompt).tolist()
    return [t % vocab for t in ids] if vocab else ids


def request_bodies(workload: Workload, model: str, *, ignore_eos: bool = True, vocab: int | None = None,
                   decode: Callable[[list[int]], str] | None = None) -> list[dict[str, Any]]:
    """One streaming completion body per request; ``decode``: send text instead of token ids."""
    bodies = []
    for spec in workload:
        ids = prompt_ids(spec, vocab)
        p = spec.params
        body: dict[str, Any] = {"model": model, "prompt": decode(ids) if decode else ids, "max_tokens": p.max_tokens,
                                "temperature": p.temperature, "stream": True,
                                "stream_options": {"include_usage": True}}
        if ignore_eos:
            body["ignore_eos"] = True
        bodies.append(body)
    return bodies


_decode_event = msgspec.json.decode


def run_loop(main) -> Any:
    """``asyncio.run(main)``, on uvloop when it is installed (its loop and sockets are C)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def _one(client: HttpStreamClient, headers: dict, body: bytes, record: RequestRecord, t0: float,
               timeout: float) -> None:
    try:
        await asyncio.sleep(max(0.0, t0 + record.arrival - time.perf_counter()))
    except asyncio.CancelledError:
        record.error = "not sent"
        raise
    start = record.sent = time.perf_counter()
    record.sent -= t0
    last = start
    chunks = 0
    try:
        async with asyncio.timeout(timeout), client.post("/completions", body, headers) as resp:
            if resp.status != 200:
                text = (await resp.read()).decode("utf-8", "replace")
                record.error = f"http {resp.status}"
                record.detail = text[:300]
                return
            done = finished = False
            async for line in resp.lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = _decode_event(data)
                if record.response_id is None:
                    record.response_id = event.get("id")
                if "error" in event:
                    record.error = "stream error"
                    record.detail = json.dumps(event["error"])[:300]
                    return
                now = time.perf_counter()
                choices = event.get("choices")
                if choices:
                    if record.ttft is None:
                        record.ttft = now - start
                    else:
                        record.itl.append(now - last)
                    last = now
                    chunks += 1
                    finished = finished or any(c.get("finish_reason") for c in choices)
                usage = event.get("usage")
                if usage:
                    record.output_tokens = usage.get("completion_tokens", 0)
            if not (done or finished):  # closed before [DONE] and before any finish_reason
                record.error = "incomplete"
                return
            record.e2e = time.perf_counter() - start
            record.output_tokens = record.output_tokens or chunks
    except asyncio.CancelledError:
        record.error = "time limit"
        raise
    except TimeoutError:
        record.error = "timeout"
    except OSError as e:  # refused, reset, unreachable
        record.error = "connect"
        record.detail = str(e)[:300]
    except (HttpError, msgspec.DecodeError) as e:
        record.error = type(e).__name__
        record.detail = str(e)[:300]


async def replay(base_url: str, bodies: Sequence[dict], records: list[RequestRecord], api_key: str | None,
               timeout: float, max_connections: int, progress: Any, time_limit: float | None = None) -> float:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    payloads = [msgspec.json.encode(b) for b in bodies]  # before the clock starts
    client = HttpStreamClient(base_url, max_connections)
    try:
        t0 = time.perf_counter()
        ended = {r.index: asyncio.get_running_loop().create_future() for r in records}  # -> perf_counter at its end

        async def tracked(body: bytes, record: RequestRecord) -> None:
            try:
                if record.after is not None:  # closed loop: released by the previous turn's end
                    try:
                        previous_end = await ended[record.after]
                    except asyncio.CancelledError:
                        record.error = "not sent"
                        raise
                    record.arrival = max(record.arrival, previous_end - t0 + record.think)
                await _one(client, headers, body, record, t0, timeout)
            finally:
                ended[record.index].set_result(time.perf_counter())
            if progress is not None:
                progress(record)

        tasks = [asyncio.ensure_future(tracked(b, r)) for b, r in zip(payloads, records)]
        done, pending = await asyncio.wait(tasks, timeout=time_limit)
        for task in pending:  # past the time limit: cancelled, counted as errors ("time limit", "not sent")
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:  # a bug, not a server's answer: raise it rather than report a short run
            if task.exception() is not None:
                raise task.exception()
        return time.perf_counter() - t0
    finally:
        await client.aclose()


def prepare(workload: Workload, model: str, *, ignore_eos: bool = True, vocab: int | None = None,
            decode: Callable[[list[int]], str] | None = None) -> tuple[list[dict], list[RequestRecord]]:
    """The request bodies of ``workload`` and one empty record each (arrivals from the first)."""
    bodies = request_bodies(workload, model, ignore_eos=ignore_eos, vocab=vocab, decode=decode)
    last_turn: dict[int, int] = {}  # session -> the index of its latest turn so far
    records = []
    for i, spec in enumerate(workload):
        after = None if spec.session is None else last_turn.get(spec.session)
        records.append(RequestRecord(i, spec.arrival - workload.requests[0].arrival, spec.num_prompt_tokens,
                                     spec.params.max_tokens, session=spec.session, after=after,
                                     think=spec.think_time, prompt_key=prompt_key(bodies[i]["prompt"]).hex()))
        if spec.session is not None:
            last_turn[spec.session] = i
    return bodies, records


def run(base_url: str, workload: Workload, model: str, *, api_key: str | None = None, ignore_eos: bool = True,
        vocab: int | None = None, decode: Callable[[list[int]], str] | None = None, timeout: float = 600.0,
        max_connections: int = 4096, time_limit: float | None = None,
        progress: Callable[[RequestRecord], None] | None = None) -> tuple[list[RequestRecord], float]:
    """Replay ``workload`` against ``base_url`` (``http://host:port/v1``); (records, wall seconds).
    ``time_limit``: seconds after which requests still running or unsent are cancelled."""
    bodies, records = prepare(workload, model, ignore_eos=ignore_eos, vocab=vocab, decode=decode)
    wall = run_loop(replay(base_url, bodies, records, api_key, timeout, max_connections, progress, time_limit))
    return records, wall


def percentiles(values: Sequence[float], scale: float = 1e3) -> dict[str, float | None]:
    """mean, p50, p90, p99 and max of ``values`` (seconds) in ms (``scale``); None each when empty."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values) * scale
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def summarize(records: Sequence[RequestRecord], wall: float, slo: Slo | None = None) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}  # the first detail of each error kind
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
            if r.detail and r.error not in examples:
                examples[r.error] = r.detail
    out_tokens = sum(r.output_tokens for r in ok)
    summary: dict[str, Any] = {
        "requests": len(records), "completed": len(ok), "errors": errors, "error_examples": examples,
        "duration_s": wall,
        "request_throughput": len(ok) / wall if wall > 0 else 0.0,
        "output_throughput_tok_s": out_tokens / wall if wall > 0 else 0.0,
        "total_throughput_tok_s": (out_tokens + sum(r.prompt_tokens for r in ok)) / wall if wall > 0 else 0.0,
        "ttft_ms": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": percentiles([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": percentiles([g for r in ok for g in r.itl]),
        "e2e_ms": percentiles([r.e2e for r in ok]),
        "send_lag_ms": percentiles([max(0.0, r.sent - r.arrival) for r in records]),
    }
    if slo is not None:
        good = sum(slo.met(r) for r in records)
        summary["slo"] = asdict(slo)
        summary["goodput_req_s"] = good / wall if wall > 0 else 0.0
        summary["slo_attainment"] = good / len(records) if records else 0.0
    return summary


def render(summary: dict[str, Any], title: str = "bench serve") -> str:
    lines = [f"{title}: {summary['completed']:,}/{summary['requests']:,} requests in {summary['duration_s']:.1f} s"
             f" ({summary['request_throughput']:.2f} req/s, {summary['output_throughput_tok_s']:,.0f} output tok/s)"]
    if summary["errors"]:
        lines.append("errors: " + ", ".join(f"{k}: {v}" for k, v in sorted(summary["errors"].items())))
        for kind, detail in sorted(summary.get("error_examples", {}).items()):
            lines.append(f"  {kind}, e.g.: {detail}")
    lines.append(f"{'ms':<8}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        s = summary[key]
        cells = "".join(f"{s[k]:>10.1f}" if s[k] is not None else f"{'-':>10}" for k in ("mean", "p50", "p90", "p99",
                                                                                          "max"))
        lines.append(f"{key.removesuffix('_ms'):<8}{cells}")
    if "goodput_req_s" in summary:
        terms = ", ".join(f"{k}={v:g}" for k, v in summary["slo"].items() if v is not None)
        lines.append(f"goodput under SLO ({terms}): {summary['goodput_req_s']:.2f} req/s "
                     f"({summary['slo_attainment']:.1%} of requests)")
    return "\n".join(lines)
