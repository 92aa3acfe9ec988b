"""The engine side of the server: one loop drives an ``LLMEngine`` on commands from the front end
and answers with ``StepOutputs`` (runtime/serving/engine_protocol.py). It runs as the engine
process's main loop (runtime/serving/engine_main.py) or on a thread of the server's own process
(runtime/serving/engine_thread.py): the same code, so the same log.

- Detokenization and stop strings stay here, in ``LLMEngine.step`` (its output processor): a stop
  string finishes its request in the step it appears, so the log is byte for byte what a
  single-process run writes.
- A request's id is the front end's key, here and in the engine (``add_request(request_id=key)``):
  deltas go back by their own ``request_id``; the loop keeps no table of requests.
- Commands are taken in between steps (after completing a step in flight, when steps overlap).
  An abort of a request that already finished does nothing; one that was still queued when its
  client left is still added first: every accepted request is in the log (Arrived, then Finished
  or Aborted), and the client-abort counters count exactly the log's ``Aborted`` events.
- After every iteration that did something, one message: the deltas by the front end's key, the
  latency observations, a snapshot of the counters and gauges (what /metrics shows).
- Several front ends (``serve --api-server-count N``): front end i uses the keys k with
  k % N == i; each message goes to every front end with its own requests' deltas and its own
  counts of commands taken, and with everything else whole (every front end's /metrics shows the
  whole engine, whichever of them answers a scrape).
"""

from __future__ import annotations

import contextlib
import gc
import queue
from collections.abc import Callable, Sequence

import msgspec

from runtime.executor.heap import freeze_heap
from runtime.executor.jit_counter import JIT
from runtime.serving.engine_protocol import (
    AbortRequest,
    AddRequest,
    Command,
    EngineFailed,
    EngineReady,
    EngineStarted,
    EngineState,
    Shutdown,
    StepOutputs,
    encode,
)
from runtime.serving.llm_engine import LLMEngine, OutputDelta, StepTimings
from runtime.serving.warmup import warm_up

CLIENT_DISCONNECTED = "client disconnected"
CLIENT_TOO_SLOW = "client too slow"
IDLE_POLL_S = 0.2  # an idle loop still looks at its stop flag this often


def describe(engine: LLMEngine, tokenizer: bytes | None = None) -> EngineStarted:
    """What the front end needs of a built engine: its config (to check requests), its clock."""
    return EngineStarted(engine.core.config, engine.clock_origin, engine.core.config.model_identity,
                         list(engine.extra_eos), tokenizer, engine.run_id)


class EngineLoop:
    """``inbox``: (front end, decoded command) pairs; ``sends[i]``: takes each encoded message for front
    end i (it must not block long)."""

    def __init__(self, engine: LLMEngine, inbox: queue.Queue[tuple[int, Command]],
                 sends: Sequence[Callable[[bytes], None]], *, warmup: bool = False) -> None:
        self.engine = engine
        self.inbox = inbox
        self.sends = list(sends)
        self.warmup = warmup
        self.serving = False  # warmed up, taking requests
        self.stopping = False
        n = len(self.sends)
        self._adds, self._commands = [0] * n, [0] * n  # per front end
        # reports for the next message (not request state: the engine's output processor holds that)
        self._rejected: dict[int, str] = {}  # key -> why
        self._added: dict[int, int] = {}  # key -> the id its log gives it
        self._timings = StepTimings()
        engine.observer = self._observe

    def _observe(self, timings: StepTimings) -> None:
        self._timings.extend(timings)  # gathered on this thread, sent with the step's message

    def stop(self) -> None:
        """From any thread (a signal handler): finish the step in flight, then stop."""
        self.stopping = True

    # --- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        engine = self.engine
        try:
            self._warm_up()
            while not self.stopping:
                took = self._take(block=not engine.busy)
                if took:
                    if self._added and engine.writer is not None:
                        engine.writer.flush()  # an id the front end hears of is on disk: a killed engine's
                        # log still holds every request a fleet log names
                    self._publish([])  # acknowledged before the step: the front end's queue count is current
                stepped = engine.busy and not self.stopping
                if stepped:
                    self._publish(engine.step())
                if (took or stepped) and engine.writer is not None:
                    engine.writer.flush()  # a reader of the live log sees every iteration whole
        except (KeyboardInterrupt, SystemExit):
            raise  # told to stop (a signal while loading or warming up): not a failure
        except BaseException as e:  # every waiting client gets an error, then the engine stops
            self.send_all(encode(EngineFailed(type(e).__name__)))
            raise
        finally:
            self._abort_all("shutdown")
            gc.unfreeze()  # frozen objects are never freed

    def _warm_up(self) -> None:
        report = warm_up(self.engine) if self.warmup else None
        freeze_heap()  # the start-up heap (torch, transformers, the model): no full collection over it in a step
        self.serving = True
        self.send_all(encode(EngineReady(report, JIT.count)))

    def send_all(self, data: bytes) -> None:
        for send in self.sends:
            send(data)

    def _take(self, block: bool) -> bool:
        """Apply the commands waiting (wait a little for one if ``block``); True if there were any."""
        try:
            client, cmd = self.inbox.get(timeout=IDLE_POLL_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            self._commands[client] += 1
            if isinstance(cmd, AddRequest):
                self._adds[client] += 1
                self._add(cmd)
            elif isinstance(cmd, AbortRequest):
                self._abort(cmd.key, cmd.reason)
            elif isinstance(cmd, Shutdown):
                self.stopping = True
            try:
                client, cmd = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _add(self, cmd: AddRequest) -> None:
        """The front end's key is the request's id in the engine too (its deltas carry it)."""
        try:
            self.engine.add_request(cmd.prompt_token_ids, cmd.params, priority=cmd.priority,
                                    arrival_time=cmd.arrival_time, cache_salt=cmd.cache_salt, request_id=cmd.key)
        except ValueError as e:  # validated by the front end against the same config: defensive
            self._rejected[cmd.key] = str(e)
            return
        self._added[cmd.key] = self.engine.log_id(cmd.key)

    def _abort(self, key: int, reason: str) -> None:
        if self.engine.abort(key, reason):  # (False: it finished, or was refused, before the abort came)
            stats = self.engine.stats
            if reason == CLIENT_TOO_SLOW:
                stats.slow_client_aborts += 1
            else:
                stats.client_aborts += 1

    def _abort_all(self, reason: str) -> None:
        for key in self.engine.unfinished:
            with contextlib.suppress(Exception):  # after an engine error the step in flight may not complete
                self.engine.abort(key, reason)

    # --- what the front end hears -----------------------------------------------------------------------

    def _publish(self, deltas: list[OutputDelta]) -> None:
        n = len(self.sends)
        keys: list[list[int]] = [[] for _ in range(n)]
        out: list[list[OutputDelta]] = [[] for _ in range(n)]
        for d in deltas:  # (a delta of a request aborted while its step was in flight: its front end drops it)
            key = d.request_id
            i = key % n
            keys[i].append(key)
            out[i].append(d)
        timings = None
        if self._timings:
            timings, self._timings = self._timings, StepTimings()
        rejected, self._rejected = self._rejected, {}
        added, self._added = self._added, {}
        state = self.state()
        for i, send in enumerate(self.sends):
            mine = state if n == 1 else msgspec.structs.replace(state, adds_taken=self._adds[i],
                                                                commands_taken=self._commands[i])
            send(encode(StepOutputs(keys[i], out[i], mine, timings, _of(rejected, i, n), _of(added, i, n))))

    def state(self) -> EngineState:
        """The counters and gauges; the commands taken are front end 0's (the only one, but for
        ``serve --api-server-count``: ``_publish`` gives each its own)."""
        engine = self.engine
        core = engine.core
        bm = core.block_manager
        return EngineState(engine.stats, core.num_running, core.num_waiting, bm.num_blocks, bm.num_used_blocks,
                           len(bm.evictable), bm.total_reserved, JIT.count, engine.busy, self._adds[0],
                           self._commands[0])


def _of(by_key: dict, i: int, n: int) -> dict:
    """The entries of front end ``i``'s keys."""
    return by_key if n == 1 else {k: v for k, v in by_key.items() if k % n == i}
