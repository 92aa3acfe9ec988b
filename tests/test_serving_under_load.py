"""The served engine under load with overlapped (async) scheduling, where step n+1 is
planned and launched while step n runs.

Each test runs the real ``minivllm serve`` (its own process, the engine in a spawned one, a tiny
random Llama with a tokenizer, the event log recorded) on CUDA (``-m gpu``, the H200) and, through
the same body, on the CPU: tests/overlapped_serve.py turns on the overlapped step loop there too
(on CUDA it is the default), so CPU CI exercises the GPU's serving path. Every test checks that
the steps did overlap (an overlapped step starts exactly where the previous one ended).

1. ``test_aborts_mid_step_*``: streams and whole requests cut mid-generation (an SSE client
   hanging up, a whole request whose client leaves: the server notices and aborts it) while the
   others go on: the survivors end whole with every token, the log and /metrics count the same
   aborts, no KV block leaks, and the recorded steps execute-replay to the same tokens.
2. ``test_sigterm_under_load_*``: SIGTERM with 50 requests mid-generation: the server exits with
   status 0 within 30 s, no stream hangs, the engine process is gone and the log is whole.
3. ``test_bad_and_edge_requests_under_load_*``: bad and edge requests (max_tokens 1, prompts at
   exactly max_model_len, empty prompts, ids outside the vocabulary, ...) mixed into a loaded
   server: 4xx or whole answers, never a 5xx, the engine process the same one throughout.

Tests 1 and 3 share one server per device (each checks only what it added to the log); test 2
stops its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch

from runtime.serving.server.launch import free_port
from tests.model_helpers import make_tiny
from tests.proc_helpers import engine_child, running, scrape, total, value
from traces.events import Aborted, Arrived, Finished, Header, Step
from traces.log import fold, read_log

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                               reason="needs a CUDA GPU")]),
]
LAUNCHER = Path(__file__).with_name("overlapped_serve.py")
MAX_MODEL_LEN = 512  # the tiny model's positions
NUM_BLOCKS = 8192  # of 4 tokens: every request of a test at its longest at once, so no preemption
FLAGS = ["--dtype", "float32", "--block-size", "4", "--num-blocks", str(NUM_BLOCKS), "--max-model-len",
         str(MAX_MODEL_LEN), "--max-num-seqs", "64", "--max-num-batched-tokens", "128"]  # 128: prompts chunked
VOCAB = 300  # prompt ids below the tiny tokenizer's size
BOUND_S = 30.0  # a stop, or the end of every stream after it


# --- the server -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("under_load") / "tiny", tokenizer=True)


class Server:
    """``minivllm serve`` (overlapped steps on any device) on a free port, recording its log."""

    def __init__(self, folder: Path, device: str, workdir: Path) -> None:
        self.device = device
        self.log = workdir / "live.jsonl"
        self.out = workdir / "server.out"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        if device == "cpu":
            env["OMP_NUM_THREADS"] = "1"  # a tiny model: one thread beats OpenMP barriers on a shared CPU
        cmd = [sys.executable, str(LAUNCHER), "serve", "--model", str(folder), "--device", device, *FLAGS,
               "--port", str(port), "--trace", str(self.log), "--trace-if-exists", "overwrite"]
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.engine_pid: int | None = None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"the server exited ({self.proc.returncode}):\n{self.output()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"not ready after {timeout:.0f} s:\n{self.output()}"
            time.sleep(0.2)
        self.engine_pid = engine_child(self.proc.pid)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def metrics(self) -> dict:
        return scrape(self.url)

    def events(self, live: bool = False) -> list:
        """The log so far: whole after every engine iteration, empty before the first (``live``:
        while the engine runs, so a last line may be half written)."""
        reader = read_log(self.log)
        events = list(reader)
        assert (live or not reader.truncated) and (not events or isinstance(events[0], Header))
        return events

    def sampled(self, prompts: list[list[int]]) -> bool:
        """Every request with one of these prompts has sampled a token (read from the live log)."""
        events = self.events(live=True)
        rid = {tuple(e.prompt.token_ids): e.request_id for e in events if isinstance(e, Arrived)}
        stepped = {s.request_id for e in events if isinstance(e, Step) for s in e.spans if s.sample}
        return all(rid.get(tuple(p), -1) in stepped for p in prompts)

    def settle(self, timeout: float = 30.0) -> dict:
        """/metrics once the engine has no request left, then holds no KV block (the gauges of its
        last message); a block still held is a leak."""
        deadline = time.monotonic() + timeout
        while (m := self.metrics()) and (value(m, "vllm:num_requests_running") or
                                         value(m, "vllm:num_requests_waiting")):
            assert time.monotonic() < deadline, "requests still in the engine after every client ended"
            time.sleep(0.05)
        deadline = time.monotonic() + 5
        while (m := self.metrics()) and value(m, "minivllm_kv_blocks_used"):
            assert time.monotonic() < deadline, (
                f"leaked KV blocks: {value(m, 'minivllm_kv_blocks_used'):.0f} used with no request left")
            time.sleep(0.05)
        assert value(m, "minivllm_kv_blocks_reserved") == 0 and value(m, "vllm:kv_cache_usage_perc") == 0
        return m

    def stop(self, sig: int = signal.SIGTERM, timeout: float = BOUND_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"the server did not exit within {timeout:.0f} s of signal {sig}") from None
        return self.proc.returncode


def launch(tiny, device: str, workdir: Path) -> Server:
    server = Server(tiny.folder, device, workdir)
    try:
        server.wait_ready(120 if device == "cpu" else 600)  # CUDA: warm-up, first Triton compilations
    except BaseException:
        server.stop(signal.SIGKILL)
        raise
    return server


@pytest.fixture(scope="module", params=DEVICES)
def served(request, tiny, tmp_path_factory):
    """One server per device for tests 1 and 3 (each looks only at what it added)."""
    server = launch(tiny, request.param, tmp_path_factory.mktemp(f"served-{request.param}"))
    try:
        yield server
    finally:
        rc = server.stop()
        assert rc == 0, f"server exit status {rc}:\n{server.output()[-3000:]}"


# --- clients ----------------------------------------------------------------------------------------


@dataclass
class Outcome:
    status: int = 0
    data: list[str] = field(default_factory=list)  # SSE payloads, [DONE] included
    body: dict | None = None  # a whole response's JSON
    ended: str = ""  # streams: done | error | cut | closed | truncated

    @property
    def chunks(self) -> list[dict]:
        return [json.loads(d) for d in self.data if d != "[DONE]"]

    @property
    def usage(self) -> dict:
        """Of a whole response, or of a stream's usage chunk."""
        if self.body is not None:
            return self.body["usage"]
        return next(c["usage"] for c in self.chunks if c.get("usage"))

    @property
    def finish_reasons(self) -> list[str]:
        choices = self.body["choices"] if self.body is not None else [c for k in self.chunks
                                                                       for c in k.get("choices", [])]
        return [c["finish_reason"] for c in choices if c["finish_reason"] is not None]

    @property
    def error(self) -> dict | None:
        if self.body is not None:
            return self.body.get("error")
        return next((c["error"] for c in self.chunks if "error" in c), None)


async def sse(client: httpx.AsyncClient, path: str, body: dict, cut_after: int | None = None,
              started: asyncio.Event | None = None) -> Outcome:
    """A streamed request; ``cut_after``: hang up after that many payloads (0: at the headers);
    ``started`` is set at the second payload (a token: chat's first one is the role)."""
    out = Outcome()
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with client.stream("POST", path, json=body) as r:
            out.status = r.status_code
            if r.status_code != 200:
                out.body = json.loads(await r.aread())
                return out
            if cut_after == 0:
                out.ended = "cut"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                out.data.append(line[5:].strip())
                if started is not None and len(out.data) == 2:
                    started.set()
                if cut_after is not None and len(out.data) >= cut_after:
                    out.ended = "cut"
                    return out  # leaving the block closes the connection mid-stream
    except httpx.RemoteProtocolError:  # the body ended without its last chunk
        out.ended = "truncated"
        return out
    out.ended = ("error" if out.error else "done") if out.data[-1:] == ["[DONE]"] else "closed"
    return out


async def whole(client: httpx.AsyncClient, path: str, body: dict | bytes) -> Outcome:
    """A whole (non-streamed) request; ``ended`` "dropped" if the connection closed without an answer."""
    try:
        if isinstance(body, bytes):
            r = await client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = await client.post(path, json=body)
    except httpx.TransportError as e:
        return Outcome(ended=f"dropped ({type(e).__name__})")
    return Outcome(status=r.status_code, body=r.json())


def run_clients(server: Server, work, timeout: float = 120.0):
    """``await work(client)`` against the server; a hung client fails the test."""
    async def main():
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            return await asyncio.wait_for(work(client), timeout)

    return asyncio.run(main())


def rand_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


# --- the log ---------------------------------------------------------------------------------------------


def check_log(events: list, since: int, overlapped: float = 0.5) -> tuple[dict[int, Arrived],
                                                                          dict[int, Finished | Aborted]]:
    """The log's invariants after a test's load: each request that arrived since ``since`` ended
    exactly once; the whole log's blocks are free (fold: no table, reservation or reference left);
    at least the share ``overlapped`` of its steps started when the one before ended (planned while
    it ran; a sequential step starts after). Returns those requests' Arrived and ends by request id."""
    new = events[since:]
    arrived = {e.request_id: e for e in new if isinstance(e, Arrived)}
    ends = Counter(e.request_id for e in new if isinstance(e, (Finished, Aborted)))
    assert set(ends) == set(arrived) and set(ends.values()) == {1}, "a request did not end exactly once"
    state = fold(events)
    assert not state.tables and not state.reserved, f"the log holds blocks: {dict(list(state.tables.items())[:3])}"
    assert not any(state.ref_counts) and len(state.free) + len(state.evictable) == state.num_blocks == NUM_BLOCKS
    steps = [e for e in new if isinstance(e, Step)]
    tiled = sum(b.start == a.end for a, b in zip(steps, steps[1:]))
    assert len(steps) > 20 and tiled >= overlapped * len(steps), f"steps did not overlap ({tiled} of {len(steps)})"
    return arrived, {e.request_id: e for e in new if isinstance(e, (Finished, Aborted))}


def check_replay(server: Server) -> None:
    """The recorded batches, run again one at a time (sequentially, no overlap), give the tokens the
    overlapped server logged: no placeholder read a wrong row after an abort."""
    from runtime.executor.setup import replay_executor_factory
    from simulator.replay.execute import execute_replay, render_execute_report

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: OpenMP barriers against a loaded CPU cost 10x
    try:
        report = execute_replay(server.log, replay_executor_factory(device=server.device))
    finally:
        torch.set_num_threads(threads)
    assert report.ok and report.compared_tokens > 0, render_execute_report(report)


def by_prompt(arrived: dict[int, Arrived]) -> dict[tuple[int, ...], int]:
    out = {tuple(e.prompt.token_ids): rid for rid, e in arrived.items()}
    assert len(out) == len(arrived), "prompts must be unique"
    return out


def no_tracebacks(server: Server) -> None:
    text = server.output()
    assert "Traceback" not in text and "unhandled" not in text, text[-3000:]


# --- 1. aborts while a step is in flight --------------------------------------------------------------


def test_aborts_mid_step_leave_survivors_whole_and_no_kv_leak(served):
    rng = random.Random(11)
    shared = rand_prompt(rng, 16)  # 4 full blocks: cut requests share them with survivors (prefix hits)

    def prompt(i: int) -> list[int]:
        return (shared if i % 3 == 0 else []) + rand_prompt(rng, rng.randrange(3, 40))

    survivors_stream = [(prompt(i), 16 + 3 * i, i) for i in range(10)]
    survivors_whole = [(prompt(i), 24 + 2 * i, i) for i in range(14)]
    cut_streams = [(prompt(i), i % 4) for i in range(16)]  # hang up after 0 (at the headers) .. 3 payloads
    cut_whole = [prompt(i) for i in range(4)]
    late = [(prompt(i), 20, i) for i in range(6)]  # arrive once the cuts have freed their blocks

    def body(p: list[int], max_tokens: int, i: int = 0) -> dict:
        sampled = {"temperature": 0.8, "seed": i} if i % 2 else {"temperature": 0}
        return {"prompt": p, "max_tokens": max_tokens, "ignore_eos": True, **sampled}

    def longest(p: list[int]) -> dict:
        return body(p, MAX_MODEL_LEN - len(p))  # runs far longer than the test if not aborted

    before = len(served.events())
    m0 = served.metrics()

    async def work(client):
        comp = "/v1/completions"
        keep = [asyncio.create_task(sse(client, comp, body(*s))) for s in survivors_stream]
        keep += [asyncio.create_task(whole(client, comp, body(*s))) for s in survivors_whole]
        cut = await asyncio.gather(*(sse(client, comp, longest(p), cut_after=k) for p, k in cut_streams))
        abandoned = [asyncio.create_task(whole(client, comp, longest(p))) for p in cut_whole]
        while not await asyncio.to_thread(served.sampled, cut_whole):  # mid-generation ...
            await asyncio.sleep(0.02)
        for t in abandoned:  # ... their clients leave: the server notices and aborts them
            t.cancel()
        await asyncio.gather(*abandoned, return_exceptions=True)
        keep += [asyncio.create_task(sse(client, comp, body(*s))) for s in late]
        return cut, await asyncio.gather(*keep)

    cut, kept = run_clients(served, work)
    for o in cut:
        assert o.status == 200 and o.ended == "cut", o
    expected = [s[1] for s in survivors_stream] + [s[1] for s in survivors_whole] + [s[1] for s in late]
    for o, n in zip(kept, expected):
        assert o.status == 200 and o.error is None, o
        assert o.usage["completion_tokens"] == n and o.finish_reasons == ["length"], o
        if o.body is None:
            assert o.ended == "done"

    m = served.settle()
    assert httpx.get(served.url + "/health").status_code == 200 and running(served.engine_pid)
    arrived, ends = check_log(served.events(), before)
    rid = by_prompt(arrived)
    aborted = {r for r, e in ends.items() if isinstance(e, Aborted)}
    assert {rid[tuple(p)] for p, _ in cut_streams} | {rid[tuple(p)] for p in cut_whole} == aborted
    assert {e.reason for r, e in ends.items() if r in aborted} == {"client disconnected"}
    for p, n, _ in survivors_stream + survivors_whole + late:
        end = ends[rid[tuple(p)]]
        assert isinstance(end, Finished) and end.reason == "length" and end.num_output_tokens == n
    for name, labels in (("minivllm_client_aborts_total", {}), ("minivllm_requests_aborted_total", {}),
                         ("vllm:request_success_total", {"finished_reason": "abort"})):
        assert total(m, name, **labels) - total(m0, name, **labels) == len(aborted) == 20, name
    check_replay(served)
    no_tracebacks(served)


# --- 3. bad and edge requests under load -----------------------------------------------------------------

L = MAX_MODEL_LEN
_edge_rng = random.Random(3)


def _p(n: int) -> list[int]:
    return rand_prompt(_edge_rng, n)


# (path, body, stream, expected completion tokens or None: any) -> 200
GOOD = [
    ("/v1/completions", {"prompt": _p(L - 1), "max_tokens": 1}, False, 1),  # the context exactly full
    ("/v1/completions", {"prompt": _p(L - 1)}, True, 1),  # max_tokens unset: shrinks to the room left
    ("/v1/completions", {"prompt": _p(L - 8), "max_tokens": 8, "ignore_eos": True}, True, 8),
    ("/v1/completions", {"prompt": _p(L - 1), "max_tokens": 1, "temperature": 1.5, "seed": 5}, True, 1),
    ("/v1/completions", {"prompt": [VOCAB - 1], "max_tokens": 1}, False, 1),
    ("/v1/completions", {"prompt": [0], "max_tokens": 3, "ignore_eos": True}, True, 3),
    ("/v1/completions", {"prompt": _p(5), "max_tokens": 1}, True, 1),
    ("/v1/completions", {"prompt": _p(64), "max_tokens": 6, "ignore_eos": True}, False, 6),  # block-aligned
    ("/v1/completions", {"prompt": _p(7), "max_tokens": 5, "n": 3, "seed": 1, "ignore_eos": True}, True, 15),
    ("/v1/completions", {"prompt": [_p(3), _p(9), _p(1)], "max_tokens": 2, "ignore_eos": True}, False, 6),
    ("/v1/completions", {"prompt": _p(9), "max_tokens": 4, "logprobs": 20, "ignore_eos": True}, True, 4),
    ("/v1/completions", {"prompt": _p(9), "max_tokens": 4, "logprobs": 0, "ignore_eos": True}, False, 4),
    ("/v1/completions", {"prompt": _p(11), "max_tokens": 6, "temperature": 2.0, "top_k": 1}, True, 6),
    ("/v1/completions", {"prompt": _p(11), "max_tokens": 6, "top_p": 1e-9, "min_p": 1.0}, False, 6),
    ("/v1/completions", {"prompt": _p(13), "max_tokens": 6, "repetition_penalty": 0.01, "presence_penalty": 2,
                         "frequency_penalty": -2}, True, 6),  # penalties: steps that cannot overlap
    ("/v1/completions", {"prompt": _p(6), "max_tokens": 3, "seed": 2**63 - 1, "temperature": 1}, True, 3),
    ("/v1/completions", {"prompt": _p(6), "max_tokens": 3, "seed": -(2**63), "temperature": 1}, False, 3),
    ("/v1/completions", {"prompt": _p(8), "max_tokens": 5, "min_tokens": 5, "stop_token_ids": list(range(VOCAB))},
     True, 5),  # every token stops, but not before min_tokens
    ("/v1/completions", {"prompt": _p(8), "max_tokens": 5, "stop_token_ids": list(range(320))}, True, 1),
    ("/v1/completions", {"prompt": _p(8), "max_tokens": 20, "stop": ["e", " ", "a"]}, True, None),
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 3, "priority": 2**62,
                         "cache_salt": "tenant"}, False, 3),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello world!"}],
                              "max_completion_tokens": 1}, True, 1),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "n": 2,
                              "ignore_eos": True, "logprobs": True, "top_logprobs": 20}, True, 6),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "x"}],
                              "max_tokens": 2, "ignore_eos": True}, False, 2),
]

# (path, body or raw bytes, status) -> a JSON error body
BAD = [
    ("/v1/completions", {"prompt": _p(L), "max_tokens": 1}, 400),  # exactly max_model_len: no room for a token
    ("/v1/completions", {"prompt": _p(L)}, 400),
    ("/v1/completions", {"prompt": _p(L - 1), "max_tokens": 2}, 400),
    ("/v1/completions", {"prompt": _p(L + 100), "max_tokens": 1}, 400),
    ("/v1/completions", {"prompt": "a" * 200_000, "max_tokens": 1}, 400),
    ("/v1/completions", {"prompt": "", "max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": [], "max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": [[1, 2], []], "max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": [-1], "max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": [5, 100_000], "max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": [2**40], "max_tokens": 4}, 400),
    ("/v1/completions", {"prompt": _p(3), "max_tokens": 0}, 400),
    ("/v1/completions", {"prompt": _p(3), "max_tokens": -1}, 400),
    ("/v1/completions", {"prompt": _p(3), "max_tokens": 10**30}, 400),
    ("/v1/completions", {"prompt": _p(3), "temperature": -1}, 400),
    ("/v1/completions", {"prompt": _p(3), "top_p": 0}, 400),
    ("/v1/completions", {"prompt": _p(3), "n": 0}, 400),
    ("/v1/completions", {"prompt": _p(3), "n": 17}, 400),
    ("/v1/completions", {"prompt": _p(3), "logprobs": 21}, 400),
    ("/v1/completions", {"prompt": _p(3), "stop_token_ids": [-5]}, 400),
    ("/v1/completions", {"prompt": _p(3), "bogus": 1}, 400),
    ("/v1/completions", {"prompt": _p(3), "model": "not-this-one"}, 404),
    ("/v1/completions", b'{"prompt": [1, 2], "temperature": NaN}', 400),
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", b'"a string"', 400),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": L}, 400),
]


def choices(body: dict) -> int:
    """Engine requests (choices) one body makes."""
    prompts = body.get("prompt")
    return body.get("n", 1) * (len(prompts) if isinstance(prompts, list) and isinstance(prompts[0], list) else 1)


def test_bad_and_edge_requests_under_load_never_stop_the_engine(served):
    before = len(served.events())
    engine = served.engine_pid

    async def load(client, worker: int, stop: asyncio.Event, done: list) -> None:
        """One client of the load: a request at a time until the edge cases are through."""
        rng = random.Random(worker)
        while not stop.is_set():
            b = {"prompt": rand_prompt(rng, rng.randrange(3, 60)), "max_tokens": 20 + worker, "ignore_eos": True,
                 "temperature": 0}
            done.append((b, await (sse if (worker + len(done)) % 2 else whole)(client, "/v1/completions", b)))

    async def work(client):
        stop, loaded = asyncio.Event(), []
        workers = [asyncio.create_task(load(client, w, stop, loaded)) for w in range(12)]
        await asyncio.sleep(0.2)  # the load is in the engine
        calls = [("good", i) for i in range(len(GOOD))] + [("bad", i) for i in range(len(BAD))]
        calls = calls * 2  # each twice: a repeat hits the prefix cache
        random.Random(7).shuffle(calls)

        def call(kind: str, i: int):
            if kind == "bad":
                return whole(client, BAD[i][0], BAD[i][1])
            path, b, stream, _ = GOOD[i]
            return sse(client, path, b) if stream else whole(client, path, b)

        outcomes = []
        for k in range(0, len(calls), 8):  # bursts of 8 concurrent requests
            batch = calls[k:k + 8]
            outs = await asyncio.gather(*(call(*c) for c in batch))
            outcomes += [(kind, i, o) for (kind, i), o in zip(batch, outs)]
            assert (await client.get("/health")).status_code == 200
        stop.set()
        await asyncio.gather(*workers)
        return outcomes, loaded

    outcomes, loaded = run_clients(served, work)
    assert not any(o.status >= 500 for _, _, o in outcomes)
    for kind, i, o in outcomes:
        if kind == "bad":
            path, b, status = BAD[i]
            assert o.status == status and o.error is not None, (b if len(str(b)) < 300 else str(b)[:300], o)
            continue
        path, b, stream, tokens = GOOD[i]
        assert o.status == 200 and o.error is None, (b, o)
        if stream:
            assert o.ended == "done", o
        assert len(o.finish_reasons) == choices(b), o
        if tokens is not None:
            assert o.usage["completion_tokens"] == tokens, (b, o.usage)
    assert len(loaded) >= 12
    for b, o in loaded:
        assert o.status == 200 and o.usage["completion_tokens"] == b["max_tokens"], o

    served.settle()
    assert served.engine_pid == engine and running(engine) and engine_child(served.proc.pid) == engine
    # penalties and stop tokens make some steps non-overlappable: fewer steps tile
    arrived, ends = check_log(served.events(), before, overlapped=0.2)
    assert not any(isinstance(e, Aborted) for e in ends.values())
    assert len(arrived) == 2 * sum(choices(b) for _, b, _, _ in GOOD) + len(loaded)
    check_replay(served)
    no_tracebacks(served)


# --- 2. SIGTERM under load -----------------------------------------------------------------------------


WHOLE_TOKENS = 100


@pytest.mark.parametrize("device", DEVICES)
def test_sigterm_under_load_exits_in_bound_with_the_log_whole(tiny, device, tmp_path):
    server = launch(tiny, device, tmp_path)
    rng = random.Random(2)
    try:
        engine = server.engine_pid

        async def work(client):
            started = [asyncio.Event() for _ in range(44)]
            tasks = []
            for i in range(50):
                p = rand_prompt(rng, rng.randrange(3, 30))
                b = {"ignore_eos": True, "temperature": 0.7 * (i % 2), "seed": i}
                if i < 36:  # far longer than the test: SIGTERM comes mid-generation
                    b = {**b, "prompt": p, "max_tokens": MAX_MODEL_LEN - len(p)}
                    tasks.append(sse(client, "/v1/completions", b, started=started[i]))
                elif i < 44:
                    msgs = [{"role": "user", "content": "The quick brown fox " * (i - 35)}]
                    b = {**b, "messages": msgs, "max_tokens": 400}
                    tasks.append(sse(client, "/v1/chat/completions", b, started=started[i]))
                else:  # shorter: uvicorn waits for them before it stops the engine
                    tasks.append(whole(client, "/v1/completions", {**b, "prompt": p, "max_tokens": WHOLE_TOKENS}))
            tasks = [asyncio.create_task(t) for t in tasks]
            await asyncio.gather(*(e.wait() for e in started))  # every stream is mid-generation
            m = await asyncio.to_thread(server.metrics)
            sent = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)  # once: a second one makes uvicorn quit at once
            try:
                rc = await asyncio.to_thread(server.proc.wait, BOUND_S)
            except subprocess.TimeoutExpired:
                rc = None  # killed in the finally below
            exited = time.monotonic() - sent
            done, pending = await asyncio.wait(tasks, timeout=max(1.0, BOUND_S - exited))
            assert not pending, f"{len(pending)} clients hung after the server exited"
            return m, rc, exited, [t.result() for t in tasks]

        m, rc, exited, outcomes = run_clients(server, work)
    finally:
        server.stop(signal.SIGKILL)
    assert value(m, "vllm:num_requests_running") >= 44  # SIGTERM came with the engine busy
    assert rc == 0 and exited < BOUND_S, (rc, exited)
    assert not running(engine), "the engine process outlived the server"
    no_tracebacks(server)

    events = server.events()
    ends = {e.request_id: e for e in events if isinstance(e, (Finished, Aborted))}
    arrived = [e.request_id for e in events if isinstance(e, Arrived)]
    assert len(arrived) == 50 and set(ends) == set(arrived), "a request is left open in the log"
    state = fold(events)
    assert not state.tables and not state.reserved and len(state.free) + len(state.evictable) == NUM_BLOCKS

    streams, wholes = outcomes[:44], outcomes[44:]
    for o in wholes:  # uvicorn lets a whole response finish (the engine stops after HTTP): whole, or an error
        assert (o.status == 200 and o.usage["completion_tokens"] == WHOLE_TOKENS) or (o.status >= 500 and o.error), o
    kinds = Counter(o.ended for o in streams)
    assert set(kinds) <= {"done", "error", "closed", "truncated"}, kinds
    for o in streams:
        if o.ended == "error":
            assert o.data[-1] == "[DONE]" and o.error["type"] == "server_error", o
            assert o.error["code"] != "internal_error", o  # an expected end, not a bug caught
