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
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from runtime.engine.routers import RouteRequest, make_router, prefix_key
from runtime.serving.async_engine import AsyncLLMEngine, RequestStream
from runtime.serving.engine_protocol import EngineState
from runtime.serving.outputs import EngineStats
from traces.events import Routed
from traces.params import SamplingParams


class _AllReady:
    """``ready`` of a fleet: set once every replica's is."""

    def __init__(self, events: Sequence[threading.Event]) -> None:
        self._events = events

    def is_set(self) -> bool:
        return all(e.is_set() for e in self._events)

    def wait(self, timeout: float | None = None) -> bool:
        return all(e.wait(timeout) for e in self._events)


def combined_state(states: Sequence[EngineState]) -> EngineState:
    """The replicas' gauges and counters, summed (finish and abort reasons merged)."""
    stats = EngineStats()
    for name in EngineStats.__struct_fields__:
        values = [getattr(s.stats, name) for s in states]
        if isinstance(values[0], dict):
            merged: dict[str, int] = {}
            for d in values:
                for k, v in d.items():
                    merged[k] = merged.get(k, 0) + v
            setattr(stats, name, merged)
        else:
            setattr(stats, name, sum(values))
    fields = {name: sum(getattr(s, name) for s in states) for name in EngineState.__struct_fields__
              if name not in ("stats", "busy")}
    return EngineState(stats, busy=any(s.busy for s in states), **fields)


class DataParallelEngine:
    def __init__(self, replicas: Sequence[AsyncLLMEngine], router: str = "round-robin", *, route_log: Any = None):
        """``route_log``: a sink for the fleet log's ``Routed`` events (its Header already written)."""
        if not replicas:
            raise ValueError("a data-parallel engine needs at least one replica")
        self.replicas = list(replicas)
        self.router = make_router(router, len(replicas))
        first = replicas[0]
        self.config, self.model_identity, self.extra_eos = first.config, first.model_identity, first.extra_eos
        self.ready = _AllReady([r.ready for r in replicas])
        self._route_log = route_log
        self._log_lock = threading.Lock()
        self._routed: list[dict[int, tuple[int, float]]] = [{} for _ in replicas]  # key -> (index, arrival)
        self._lock = threading.Lock()
        self._index = 0
        for i, replica in enumerate(replicas):
            replica.on_added = lambda added, rejected, i=i: self._added(i, added, rejected)

    # --- what the server reads of one engine ------------------------------------------------------

    def now(self) -> float:
        return self.replicas[0].now()

    def start(self) -> None:
        for r in self.replicas:
            r.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        for r in self.replicas:
            r.shutdown(timeout)

    @property
    def alive(self) -> bool:
        return all(r.alive for r in self.replicas)

    @property
    def max_pending(self) -> int:
        return sum(r.max_pending for r in self.replicas)

    @property
    def state(self) -> EngineState:
        return combined_state([r.state for r in self.replicas])

    @property
    def stats(self) -> EngineStats:
        return self.state.stats

    @property
    def rejected_overloaded(self) -> int:
        return sum(r.rejected_overloaded for r in self.replicas)

    @property
    def jit_at_ready(self) -> int:
        return sum(r.jit_at_ready for r in self.replicas)

    @property
    def settled(self) -> bool:
        return all(r.settled for r in self.replicas)

    @property
    def observer(self):
        return self.replicas[0].observer

    @property
    def on_dead(self):
        return self.replicas[0].on_dead

    @on_dead.setter
    def on_dead(self, fn) -> None:  # any replica stopping makes the whole server stop (alive is all of them)
        for r in self.replicas:
            r.on_dead = fn

    @observer.setter
    def observer(self, fn) -> None:
        for r in self.replicas:
            r.observer = fn

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        self.replicas[0].validate(num_prompt_tokens, params)

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        return self.replicas[0].sampling_params(params)

    # --- routing ---------------------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0, *,
               arrival_time: float | None = None, cache_salt: str | None = None) -> RequestStream:
        """Route the request (the router's choice from the replicas' loads), then submit it there."""
        arrival = self.now() if arrival_time is None else arrival_time
        key = prefix_key(prompt_token_ids) if self.router.needs_prefix else None
        with self._lock:  # one routing decision at a time, in arrival order: its index
            index = self._index
            choice = self.router.route(RouteRequest(index, len(prompt_token_ids), key),
                                       [r.load() for r in self.replicas])
            replica = self.replicas[choice]
            self._routed[choice][replica.next_key] = (index, arrival)
            try:
                stream = replica.submit(prompt_token_ids, params, priority, arrival_time=arrival,
                                        cache_salt=cache_salt)
            except BaseException:
                self._routed[choice].pop(replica.next_key, None)
                raise
            self._index += 1
        return stream

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
            # the replicas start one after another: each sizes its pool from its share of the whole
            # GPU (the later ones would see the earlier ones' pools as used), leaving a fifth of the
            # share for its weights, graphs and activations
            total = torch.cuda.get_device_properties(0).total_memory / 2**30
            options["kv_cache_gb"] = total * options.get("gpu_memory_utilization", 0.9) / replicas * 0.8
    return LLMEngine(**options)
