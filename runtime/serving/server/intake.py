"""A request's intake (body -> validated request + prompt ids) off the event loop that streams
other requests' tokens.

A large body is taken in whole by a worker process (parse, validate, template, tokenize): Jinja
templating, JSON parsing and pydantic validation hold the GIL, so a thread would still stall the
loop; a process does not share it. The worker returns the request without its prompt, and the ids
as a packed array (unpickled in µs). A small body stays on the loop, its tokenizing in a thread
(HF tokenizers drop the GIL), since a process round trip costs more than it saves (``INLINE_BYTES``).

The pool starts with the first large request (a process spawned, the tokenizer sent once), or
at start-up under ``minivllm serve`` (``start``): there every worker is spawned and has run a task
before ``up`` is set, and ``/ready`` waits for it. A worker's start imports the tokenizer's library
(seconds on a GPU machine); a pool started on demand made the first long prompts after start-up
wait that long (5-7 s on an H200 machine). A worker that dies (killed, out of memory) fails
its request with a 503 and the pool is made afresh; a worker whose server is gone exits.

A body's bytes become the endpoint's body model as FastAPI reads a body parameter (``parse_body``),
the same code on the loop and in a worker: JSON only under a JSON content type (none given: not
JSON, as FastAPI's strict default), a decode error as ``json_invalid``, every validation error
located under ``body``. The counts on the raw body (``precheck``) run before it is parsed, on its
members as raw JSON (``prompts.raw_members``): 240,000 messages are refused before any of them is built.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import email.message
import json
import logging
import multiprocessing
import os
import pickle
import threading
import time
from array import array
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from msgspec import Raw
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from runtime.engine.admission import validate_request
from runtime.engine.config import EngineConfig
from runtime.serving.process_name import INTAKE, name_process
from runtime.serving.server.errors import Classified, ModelNotFound, classify, error_body, log_unexpected
from runtime.serving.server.prompts import Prompts, members_of, raw_members
from traces.params import SamplingParams

log = logging.getLogger("minivllm.server")

# Bodies below this stay on the loop. Measured on a 2-core CPU with SmolLM2's tokenizer: parse +
# validate + template cost the loop ~0.08 µs a byte (a 5 KB chat 0.5 ms, 18 KB 1.4 ms, a 600 KB
# one ~55 ms); a worker round trip adds ~0.5 ms to its request (pickles, two pipe hops, wake-ups)
# and queues it behind the other large ones. At 16 KiB the loop's cost stays under a fast
# engine's token interval (~4 ms); below it, the round trip would cost more than it saves.
INLINE_BYTES = 16 << 10
WORKER_START_S = 300.0  # the longest the workers' start may take before /ready gives up waiting


def worker_count(cores: int, front_ends: int) -> int:
    """Intake processes per front end: a share of half the cores (the rest run the engine, the
    event loops and their tokenizer threads), 1 to 4: each worker holds a tokenizer (~100 MB)."""
    return min(4, max(1, cores // (2 * front_ends)))


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """What checking a prompt needs of the engine, in a worker (``Prompts``' ``engine``)."""

    config: EngineConfig
    max_pending: int

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        validate_request(self.config, num_prompt_tokens, params)


# Large requests a front end's workers may be taking in or holding queued, per worker; past that a
# large request is refused at once (429, as a full engine queue is) instead of waiting behind
# seconds of other requests' templating: its intake wait stays bounded.
PENDING_PER_WORKER = 8


class Intake:
    def __init__(self, prompts: Prompts, tokenizer: Any, model_name: str, workers: int = 1) -> None:
        self.prompts, self.tokenizer, self.model_name, self.workers = prompts, tokenizer, model_name, workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False  # the server is stopping: no worker is started any more
        self.taken_in_pool = 0  # large requests taken in by a worker (tests, /metrics later)
        self.max_pending = PENDING_PER_WORKER * workers
        self.pending = 0  # large requests given to the workers and not answered yet
        self.refused_busy = 0  # large requests refused because that many were pending
        self.up = threading.Event()  # every worker started (``start``); set at once when none is asked for
        self.up.set()
        self.worker_pids: set[int] = set()  # the workers that have answered ``start``'s tasks

    async def take(self, endpoint: Any, raw: Request) -> tuple[Any, list[list[int]]]:
        """(the request, its prompts' ids), or an exception the error handlers answer (a 400 naming
        the field, 404 for another model, 503 if the worker died)."""
        try:
            data = await raw.body()
        except ClientDisconnect:  # gone mid-body: nobody reads the answer (no error worth logging)
            raise Classified(400, error_body("the request body was cut off")) from None
        content_type = raw.headers.get("content-type")
        if len(data) < INLINE_BYTES:
            req = parse_body(endpoint.body, data, content_type, lambda b: endpoint.precheck(self.prompts, b))
            self.check_model(req.model)
            return req, await endpoint.prompts(self.prompts, req)
        if self.pending >= self.max_pending:
            self.refused_busy += 1
            raise Classified(429, error_body(f"{self.pending} large requests are being taken in; retry",
                                             "rate_limit_error", code="intake_busy"))
        self.pending += 1
        try:
            # submitted from a thread: a submit may spawn a worker, and the spawn's write of the
            # tokenizer to the child blocks until the child has imported its modules (seconds)
            pool = await asyncio.to_thread(self._get_pool)
            job = await asyncio.to_thread(pool.submit, _take_in, _index(endpoint), data, content_type)
            status, req, ids = await asyncio.wrap_future(job)
        except BrokenProcessPool:
            self._drop(pool)
            raise Classified(503, error_body("the process taking this request in died; retry", "server_error",
                                             code="intake_worker_died")) from None
        finally:
            self.pending -= 1
        if status != 200:
            raise Classified(status, req)
        self.taken_in_pool += 1
        return req, [a.tolist() for a in ids]

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise ModelNotFound(self.model_name)

    def start(self) -> None:
        """Start every worker now, in the background (``minivllm serve``); ``up`` is set once each
        has run a task, or once the start has failed or timed out (logged; the workers are then
        spawned on demand, and a broken pool answers a 503), so the first large requests find them
        ready instead of waiting seconds for processes to import."""
        self.up.clear()

        def start() -> None:
            try:
                self._start_workers()
            except Exception as exc:
                if not self._closed:  # (stopped before it started: nothing to say)
                    log.warning("intake workers did not start: %s: %s", type(exc).__name__, exc)
            finally:
                self.up.set()

        threading.Thread(target=start, name="minivllm-intake-start", daemon=True).start()

    def _start_workers(self) -> None:
        """Rounds of one short task per worker until as many workers have answered as the pool has:
        the pool spawns a process for each task no idle worker takes, and a task runs only once its
        worker has started."""
        pool = self._get_pool()
        deadline = time.monotonic() + WORKER_START_S
        while len(self.worker_pids) < self.workers:
            jobs = [pool.submit(_hello) for _ in range(self.workers)]
            try:
                self.worker_pids.update(job.result(timeout=max(0.0, deadline - time.monotonic())) for job in jobs)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"{len(self.worker_pids)} of {self.workers} intake workers started "
                                   f"in {WORKER_START_S:.0f} s") from None

    def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._closed:  # a pool started now would outlive the server's exit, a worker mid-spawn
                raise RuntimeError("the server is stopping")
            if self._pool is None:
                limits = EngineLimits(self.prompts.engine.config, self.prompts.engine.max_pending)
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                    initargs=(pickle.dumps(self.tokenizer), limits, self.model_name, os.getpid()))
            return self._pool

    def _drop(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers (they finish nothing queued: the server is going)."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def parse_body(model: type[BaseModel], data: bytes, content_type: str | None,
          precheck: Callable[[dict[str, Raw]], None]) -> Any:
    """``model`` from ``data``; RequestValidationError (a 400 naming the field) when it is not one."""
    body: Any = None
    if data:
        body = data
        if _is_json(content_type):
            top = raw_members(data)
            if top is not None:  # counted before a single object is built (not JSON: the parse says why)
                precheck(top)
            try:
                body = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestValidationError([{"type": "json_invalid", "loc": ("body", getattr(e, "pos", 0)),
                                               "msg": "JSON decode error", "input": {}}]) from None
            except RecursionError:  # nesting deeper than the parser goes: not a body anyone sends
                raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                               "msg": "JSON nested too deeply", "input": {}}]) from None
            if top is None and isinstance(body, dict) and (late := members_of(body)) is not None:
                precheck(late)  # JSON msgspec does not read (a byte-order mark, NaN): counted now
    if body is None:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])}
                                      for err in e.errors(include_url=False, include_context=False)]) from None


def _index(endpoint: Any) -> int:
    from runtime.serving.server.endpoints import ENDPOINTS

    return ENDPOINTS.index(endpoint)


# --- in the worker process -------------------------------------------------------------------------

_worker: Intake | None = None


def _start(tokenizer: bytes, limits: EngineLimits, model_name: str, parent: int) -> None:
    global _worker
    name_process(INTAKE)
    tok = pickle.loads(tokenizer)  # noqa: S301 (our own server's)
    _worker = Intake(Prompts(tok, limits), tok, model_name)
    threading.Thread(target=_exit_with, args=(parent,), name="minivllm-intake-parent", daemon=True).start()


def _exit_with(parent: int) -> None:
    """A server killed outright (SIGKILL) shuts no pool down: its workers must not outlive it."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _hello() -> int:
    """A worker's answer once it has started (``Intake._start_workers``): held briefly, so the
    round's other tasks go to other workers."""
    time.sleep(0.05)
    return os.getpid()


def _take_in(endpoint_index: int, data: bytes, content_type: str | None) -> tuple[int, Any, list[array]]:
    """(200, the request less its prompt, each prompt's ids) or (status, error body, [])."""
    from runtime.serving.server.endpoints import ENDPOINTS

    endpoint, worker = ENDPOINTS[endpoint_index], _worker
    try:
        req = parse_body(endpoint.body, data, content_type, lambda b: endpoint.precheck(worker.prompts, b))
        worker.check_model(req.model)
        ids = endpoint.prompts_now(worker.prompts, req)
        return 200, endpoint.without_prompt(req), [array("i", p) for p in ids]
    except Exception as exc:  # every answer a plain (status, body): an exception may not unpickle
        status, body = classify(exc)
        if status >= 500:
            log_unexpected(exc, "request intake")
        return status, body, []
