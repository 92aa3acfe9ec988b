"""Data-parallel serving: N engine replicas behind one front door (``minivllm serve
--data-parallel-size N``), the live twin of the simulator's fleet (``simulate --replicas N``).

Each replica is an ``AsyncLLMEngine`` over an engine of its own (a process, with a GPU of its own
when there are as many, else sharing one). ``submit`` asks the router, the pure code the
simulated fleet runs (runtime/engine/routers.py), which replica takes the request, from what this
front door sees of each (``AsyncLLMEngine.load``: requests it was handed and has not finished,
prompt tokens still waiting for a first token, KV in use as of its last message). The replicas'
clocks share one origin, so their logs share one time axis; with a trace, the front door writes
the fleet log (traces/fleet_log.py): one ``Routed`` event per request, once its replica has told
the request id its log gives it.

To the server this is one engine: the same attributes an ``AsyncLLMEngine`` has, with counters
summed over the replicas.

A replica that dies (its process killed or crashed) takes down only its own requests: their
streams end with an error naming it, the others never notice; one routed to it that it never took
in goes to another replica (runtime/serving/fleet_stream.py). The router skips it while it is
down (no replica up: 503), it is started again as the restart policy allows
(runtime/serving/replica_restarts.py) with a log of its own, and the fleet log records the death
and the return (``ReplicaDown``, ``ReplicaUp``). Only when every replica is down for good does the
server stop (``on_dead``), as a single engine's death stops it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from runtime.engine.routers import RouteRequest, make_router, prefix_key
from runtime.serving.async_engine import AsyncLLMEngine, EngineDead, RequestStream
from runtime.serving.engine_protocol import EngineState
from runtime.serving.fleet_stream import FleetStream
from runtime.serving.outputs import EngineStats
from runtime.serving.replica_restarts import RestartPolicy, retry_start
from traces.events import ReplicaDown, ReplicaUp, Routed
from traces.params import SamplingParams


class _UpReady:
    """``ready`` of a fleet: set once every replica up is (and one is)."""

    def __init__(self, events: Callable[[], list[threading.Event]]) -> None:
        self._events = events

    def is_set(self) -> bool:
        events = self._events()
        return bool(events) and all(e.is_set() for e in events)

    def wait(self, timeout: float | None = None) -> bool:
        return all(e.wait(timeout) for e in self._events())


def summed_stats(stats: Sequence[EngineStats]) -> EngineStats:
    """Counters summed (finish and abort reasons merged)."""
    out = EngineStats()
    for name in EngineStats.__struct_fields__:
        values = [getattr(s, name) for s in stats]
        if isinstance(values[0], dict):
            merged: dict[str, int] = {}
            for d in values:
                for k, v in d.items():
                    merged[k] = merged.get(k, 0) + v
            setattr(out, name, merged)
        else:
            setattr(out, name, sum(values))
    return out


def combined_state(states: Sequence[EngineState]) -> EngineState:
    """The replicas' gauges and counters, summed (finish and abort reasons merged)."""
    fields = {name: sum(getattr(s, name) for s in states) for name in EngineState.__struct_fields__
              if name not in ("stats", "busy")}
    return EngineState(summed_stats([s.stats for s in states]), busy=any(s.busy for s in states), **fields)


# a replica's state: taking requests, down and starting again, or down for good
UP, RESTARTING, FAILED = "up", "restarting", "failed"

# what starts replica i again after its k-th death: its front end (not started) and its new log (None: no log)
ReplicaStarter = Callable[[int, int], tuple[AsyncLLMEngine, str | None]]


def _say(message: str) -> None:
    print(f"minivllm: {message}", file=sys.stderr, flush=True)


class DataParallelEngine:
    def __init__(self, replicas: Sequence[AsyncLLMEngine], router: str = "round-robin", *, route_log: Any = None,
                 restart: ReplicaStarter | None = None, policy: RestartPolicy | None = None,
                 say: Callable[[str], None] = _say) -> None:
        """``route_log``: a sink for the fleet log's events (its Header already written); ``restart``:
        starts a dead replica again (None: a dead replica stays down), as ``policy`` allows."""
        if not replicas:
            raise ValueError("a data-parallel engine needs at least one replica")
        self.replicas = list(replicas)
        self.router = make_router(router, len(replicas))
        first = replicas[0]
        self.config, self.model_identity, self.extra_eos = first.config, first.model_identity, first.extra_eos
        self.status = [UP] * len(replicas)
        self.restarts = [0] * len(replicas)
        self.down_reasons: list[str | None] = [None] * len(replicas)
        self.ready = _UpReady(lambda: [r.ready for r, s in zip(self.replicas, self.status) if s == UP])
        self._restart, self._policy, self._say = restart, policy or RestartPolicy(), say
        self._route_log = route_log
        self._log_lock = threading.Lock()
        self._routed: list[dict[int, tuple[int, float]]] = [{} for _ in replicas]  # key -> (index, arrival)
        self._lock = threading.Lock()
        self._index = 0
        self._stopping = threading.Event()
        self._restarters: list[threading.Thread] = []
        self._observer = None
        self.on_dead: Callable[[str], None] | None = None  # once no replica is up and none will be (the server stops)
        # what the dead replicas had counted: the fleet's counters never go back
        self._retired_stats, self._retired_rejected, self._retired_jit = EngineStats(), 0, (0, 0)
        for i, replica in enumerate(replicas):
            self._attach(i, replica)

    def _attach(self, i: int, replica: AsyncLLMEngine) -> None:
        replica.on_added = lambda added, rejected: self._added(i, added, rejected)
        replica.replica = i  # its requests' names carry it (traces/request_names.py)
        replica.on_dead = lambda reason: self._died(i, replica, reason)
        replica.observer = self._observer

    # --- what the server reads of one engine ------------------------------------------------------

    def now(self) -> float:
        return self.replicas[0].now()  # (a dead one's clock still reads: the replicas share one origin)

    def start(self) -> None:
        for r in self.replicas:
            r.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._lock, self._log_lock:  # no replica is started again, no outage logged after this
            self._stopping.set()
        for r in self.replicas:
            r.shutdown(timeout)
        for t in self._restarters:  # (one starting an engine shuts it down once built)
            t.join(timeout)

    def _up(self) -> list[AsyncLLMEngine]:
        return [r for r, s in zip(self.replicas, self.status) if s == UP]

    @property
    def alive(self) -> bool:
        """While any replica is up (the others may be starting again)."""
        return UP in self.status

    def replica_health(self) -> list[dict[str, Any]]:
        """Each replica's state for /health: up, restarting or failed, its restarts, why it is down."""
        return [{"replica": i, "status": s, "restarts": self.restarts[i],
                 **({"error": self.down_reasons[i]} if s != UP else {})} for i, s in enumerate(self.status)]

    @property
    def max_pending(self) -> int:
        return sum(r.max_pending for r in self.replicas)

    @property
    def state(self) -> EngineState:
        """The replicas up, summed, with the counters of those that died."""
        up = [r.state for r in self._up()]
        state = combined_state(up) if up else EngineState(EngineStats())
        state.stats = summed_stats([state.stats, self._retired_stats])
        state.jit_compilations += self._retired_jit[0]
        return state

    @property
    def stats(self) -> EngineStats:
        return self.state.stats

    @property
    def rejected_overloaded(self) -> int:
        return sum(r.rejected_overloaded for r in self.replicas) + self._retired_rejected

    @property
    def jit_at_ready(self) -> int:
        return sum(r.jit_at_ready for r in self._up()) + self._retired_jit[1]

    @property
    def settled(self) -> bool:
        return all(r.settled for r in self._up())

    @property
    def observer(self):
        return self._observer

    @observer.setter
    def observer(self, fn) -> None:
        self._observer = fn
        for r in self.replicas:
            r.observer = fn

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        self.replicas[0].validate(num_prompt_tokens, params)

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        return self.replicas[0].sampling_params(params)

    # --- routing ---------------------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0, *,
               arrival_time: float | None = None, cache_salt: str | None = None) -> FleetStream:
        """Route the request (the router's choice from the replicas' loads, of those up), then submit
        it there: EngineDead (503) at once when none is up. Routed again if that replica vanishes
        before taking it in (runtime/serving/fleet_stream.py), so EngineDead or EngineOverloaded may
        also end the stream before its first output."""
        arrival = self.now() if arrival_time is None else arrival_time
        stream, index = self._route(prompt_token_ids, params, priority, arrival, cache_salt)
        return FleetStream(stream, lambda: self._route(prompt_token_ids, params, priority, arrival, cache_salt,
                                                       index)[0], resends=len(self.replicas) - 1)

    def _route(self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int, arrival: float,
               cache_salt: str | None, index: int | None = None) -> tuple[RequestStream, int]:
        """Route and submit; the stream and the request's index in the fleet log's order (a new one,
        or ``index``: a request sent again keeps its own)."""
        key = prefix_key(prompt_token_ids) if self.router.needs_prefix else None
        with self._lock:  # one routing decision at a time, in arrival order: its index
            fresh = index is None
            if fresh:
                index = self._index
            up = self._routable()
            while True:
                if not any(up):
                    raise EngineDead(self._why_none())
                choice = self.router.route(RouteRequest(index, len(prompt_token_ids), key),
                                           [r.load() for r in self.replicas], up)
                replica = self.replicas[choice]
                self._routed[choice][replica.next_key] = (index, arrival)
                try:
                    stream = replica.submit(prompt_token_ids, params, priority, arrival_time=arrival,
                                            cache_salt=cache_salt)
                except EngineDead:  # died a moment ago (not yet told): the request was not sent
                    self._routed[choice].pop(replica.next_key, None)
                    up[choice] = False
                    continue
                except BaseException:
                    self._routed[choice].pop(replica.next_key, None)
                    raise
                break
            if fresh:
                self._index += 1
        return stream, index

    def _routable(self) -> list[bool]:
        """The replicas the router may choose: those up, but of one started again only once warmed up
        (unless none other is up: then its queue is the only one)."""
        up = [s == UP and r.alive for r, s in zip(self.replicas, self.status)]
        warm = [u and (k == 0 or r.ready.is_set()) for u, k, r in zip(up, self.restarts, self.replicas)]
        return warm if any(warm) else up

    def _why_none(self) -> str:
        reasons = "; ".join(f"replica {i}: {why}" for i, why in enumerate(self.down_reasons) if why)
        return f"no replica is running ({reasons})" if reasons else "no replica is running"

    def _added(self, replica: int, added: dict[int, int], rejected: dict[int, str]) -> None:
        """A replica's message told the ids of the adds it took (and the keys it refused)."""
        routed = self._routed[replica]
        events = [Routed(time=arrival, index=index, replica=replica, request_id=added.get(key))
                  for key in [*added, *rejected] if (entry := routed.pop(key, None)) is not None
                  for index, arrival in [entry]]
        if self._route_log is not None and events:
            with self._log_lock:
                for event in events:
                    self._route_log(event)

    def _log(self, event: ReplicaDown | ReplicaUp) -> None:
        with self._log_lock:
            if self._route_log is not None and not self._stopping.is_set():
                self._route_log(event)

    # --- outages ---------------------------------------------------------------------------------

    def _died(self, i: int, replica: AsyncLLMEngine, reason: str) -> None:
        """Replica ``i`` stopped on its own (its connection's thread): its streams have ended with
        EngineDead; the others go on. It is started again if the policy allows."""
        with self._lock:
            if self._stopping.is_set() or self.replicas[i] is not replica or self.status[i] != UP:
                return
            self._retire(replica)
            delay = self._policy.delay(self.restarts[i]) if self._restart is not None else None
            self.status[i] = RESTARTING if delay is not None else FAILED
            self.down_reasons[i] = reason
            self._routed[i] = {}  # sent, never told an id: sent again elsewhere (or failed), unlogged here
        self._log(ReplicaDown(time=self.now(), replica=i, reason=reason, restarting=delay is not None))
        named = reason if reason.startswith(f"replica {i}:") else f"replica {i}: {reason}"
        if delay is None:
            self._say(f"{named}; no restart left, it stays down")
            self._maybe_all_dead()
            return
        self._say(f"{named}; starting it again in {delay:g} s "
                  f"(restart {self.restarts[i] + 1} of {self._policy.restarts})")
        t = threading.Thread(target=self._start_again, args=(i,), name=f"minivllm-restart-{i}", daemon=True)
        self._restarters.append(t)
        t.start()

    def _retire(self, replica: AsyncLLMEngine) -> None:
        """Under ``_lock``: keep what a dead replica counted."""
        self._retired_stats = summed_stats([self._retired_stats, replica.state.stats])
        self._retired_rejected += replica.rejected_overloaded
        jit, at_ready = self._retired_jit
        self._retired_jit = (jit + replica.state.jit_compilations, at_ready + replica.jit_at_ready)

    def _start_again(self, i: int) -> None:
        assert self._restart is not None
        started, done = retry_start(self._policy, self.restarts[i], lambda k: self._restart(i, k), self._stopping,
                                lambda message: self._say(f"replica {i}: {message}"))
        with self._lock:
            self.restarts[i] = done
            installed = started is not None and not self._stopping.is_set()
            if installed:
                engine, log = started
                self._attach(i, engine)
                self.replicas[i] = engine
                self._routed[i] = {}
                self._log(ReplicaUp(time=self.now(), replica=i, log=log))  # before any of its Routed
                engine.start()
                self.status[i], self.down_reasons[i] = UP, None
            elif started is None and not self._stopping.is_set():
                self.status[i] = FAILED
        if installed:
            self._say(f"replica {i}: running again (restart {done} of {self._policy.restarts})")
        elif started is not None:  # built as the server stopped
            started[0].shutdown()
        elif not self._stopping.is_set():
            self._say(f"replica {i}: no restart left, it stays down")
            self._maybe_all_dead()

    def _maybe_all_dead(self) -> None:
        if all(s == FAILED for s in self.status) and self.on_dead is not None and not self._stopping.is_set():
            self.on_dead(self._why_none())


def replica_engine(replica: int, replicas: int, **options: Any):
    """The LLMEngine of replica ``replica`` of ``replicas`` (in its engine process): on CUDA a GPU
    of its own when there are as many, else a ``1/replicas`` share of the one GPU's memory."""
    import torch

    from runtime.serving.llm_engine import LLMEngine

    device = options.get("device") or "auto"
    if device in ("auto", "cuda") and torch.cuda.is_available():
        if torch.cuda.device_count() >= replicas:
            options["device"] = f"cuda:{replica}"
        elif options.get("kv_cache_gb") is None and options.get("num_blocks") is None:
            from runtime.executor.kv_cache import shared_gpu_kv_gb

            options["kv_cache_gb"] = shared_gpu_kv_gb(0, replicas, options.get("gpu_memory_utilization", 0.9))
    return LLMEngine(**options)
