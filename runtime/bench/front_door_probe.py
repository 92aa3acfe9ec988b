"""The front door's delay on this machine, measured where it happens: ``minivllm serve`` of the
engine being profiled (a child process, as ``bench serve --launch`` starts one) takes completions
one at a time, each sent once the one before has finished, so each finds the engine idle: in the
server's log, from a request's arrival stamp to the start of its first step is the front door's
delay (parsing, the hop to the engine process, waking the engine loop) and nothing else.

Prompts are token ids (as ``bench serve`` sends them) of lengths from 16 tokens to the longest the
engine takes (its model card's max_model_len), so the delay is fitted against the prompt's length
(simulator/cost/front_door_fit.py, ``fit_front_door``); the simulator's front door charges it to each
request (simulator/fleet/front_door.py).

Then batches of requests stream their tokens at once (``STREAM_BATCHES``, ``STREAM_TOKENS`` each):
decode steps as a served engine runs them, beside its front end's work, which the fit sets against
the profile's steps of the engine alone (simulator/fitting/served_steps.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.bench.server_process import ServerProcess

GAP_S = 0.05  # between a response and the next request: the engine is idle again
STREAM_BATCHES, STREAM_TOKENS, STREAM_PROMPT = (1, 4, 16), 32, 64  # streamed decode batches, tokens, prompt
IDS = (10, 100)  # prompt token ids are drawn from here (every vocabulary has them)


@dataclass(frozen=True)
class ProbeResult:
    log: str
    sent: int
    refused: int  # prompts the server refused (longer than it takes)
    seconds: float


def probe_lengths(requests: int, longest: int) -> list[int]:
    """``requests`` prompt lengths, geometric from 16 to ``longest``, cycled (short and long alike)."""
    grid, n = [], 16
    while n < longest:
        grid.append(n)
        n *= 2
    grid.append(max(longest, 1))
    return [grid[i % len(grid)] for i in range(requests)]


def probe_front_door(flags: Sequence[str], log: str | Path, *, requests: int, server_log: str | Path, port: int,
                     seed: int = 0, ready_timeout: float = 900.0) -> ProbeResult:
    """Serve with ``flags`` (engine flags, as after ``bench serve --launch``) on ``port``, send
    ``requests`` prompts one after another (max_tokens 1, greedy), then the streamed batches, stop the
    server; its event log is ``log``."""
    import httpx

    from runtime.bench.server_probe import served_models

    rng = random.Random(seed)
    started = time.monotonic()
    sent = refused = 0
    with ServerProcess([*flags, "--trace-if-exists", "overwrite"], port=port, trace=str(log),
                       log_file=str(server_log)) as server:
        server.wait_ready(ready_timeout)
        # up to the engine's own limit (a prompt and its one output token within it)
        longest = next(iter(served_models(server.url + "/v1").values())) - 2
        with httpx.Client(base_url=server.url, timeout=ready_timeout) as client:
            for n in probe_lengths(requests, longest):
                ids = [rng.randrange(*IDS) for _ in range(n)]
                resp = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1, "temperature": 0})
                sent += 1
                refused += resp.status_code == 400
                if resp.status_code not in (200, 400):
                    raise RuntimeError(f"the front-door probe's server answered HTTP {resp.status_code}: "
                                       f"{resp.text[:200]} (see {server_log})")
                time.sleep(GAP_S)
            for batch in STREAM_BATCHES:
                _stream_batch(client, [[rng.randrange(*IDS) for _ in range(STREAM_PROMPT)] for _ in range(batch)])
                sent += batch
                time.sleep(GAP_S)
    return ProbeResult(str(log), sent, refused, time.monotonic() - started)


def _stream_batch(client, prompts: list[list[int]]) -> None:
    """Send ``prompts`` at once, each streaming ``STREAM_TOKENS`` tokens (greedy, past any EOS)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(ids: list[int]) -> None:
        body = {"prompt": ids, "max_tokens": STREAM_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as resp:
            for _ in resp.iter_lines():
                pass
            if resp.status_code != 200:
                raise RuntimeError(f"the front-door probe's server answered HTTP {resp.status_code} to a stream")

    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(one, prompts))
