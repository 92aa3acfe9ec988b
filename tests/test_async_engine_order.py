"""The front end hands an engine message's deltas to their streams with the requests' first tokens
first: an event loop runs the streams in the order their items arrive, so a first token queued
behind every running stream's next one would wait for all of them (TTFT the engine did not spend)."""

from __future__ import annotations

import asyncio

from runtime.engine.config import EngineConfig
from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.engine_protocol import EngineStarted, EngineState, StepOutputs, encode
from runtime.serving.llm_engine import EngineStats, OutputDelta
from traces.params import SamplingParams


class StubConnection:
    """An engine that takes every command and says nothing unless told to (``on_message``)."""

    alive = True

    def __init__(self) -> None:
        self.started = EngineStarted(EngineConfig(), 0.0, "stub", [])
        self.on_message = None

    def now(self) -> float:
        return 0.0

    def start(self, on_message, on_lost) -> None:
        self.on_message = on_message

    def send(self, data: bytes) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


def test_first_tokens_reach_their_streams_before_the_running_ones():
    connection = StubConnection()
    engine = AsyncLLMEngine(connection=connection)
    engine.start()

    async def main() -> list[int]:
        streams = [engine.submit([1, 2, 3], SamplingParams(max_tokens=8)) for _ in range(4)]
        woken: list[int] = []

        async def read(i: int) -> None:
            await anext(streams[i])
            woken.append(i)

        readers = [asyncio.ensure_future(read(i)) for i in range(4)]
        await asyncio.sleep(0)  # every reader waits on its stream
        # one step: streams 0 and 2 decode their 5th token, 1 and 3 get their first
        deltas = [OutputDelta(i, "x", [7], None, 3, 1 if i % 2 else 5) for i in range(4)]
        connection.on_message(encode(StepOutputs(list(range(4)), deltas, EngineState(EngineStats()))))
        await asyncio.gather(*readers)
        return woken

    assert asyncio.run(main()) == [1, 3, 0, 2]
