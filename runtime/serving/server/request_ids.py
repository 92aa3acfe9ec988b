"""The ids a response carries: each engine request's name in the server's event log
(traces/request_names.py) behind the endpoint's prefix, ``cmpl-<run>-<request id>`` (one engine)
or ``cmpl-<run>-<replica>-<request id>`` (a data-parallel fleet).

A call is one engine request per prompt and choice. Its body's ``id`` (every streamed chunk's
too) names the first; the ``X-Request-Id`` header lists them all, comma-separated, in the order
of the choices' ``index``. The engine reports a request's log id as it takes the request in,
before any output of it, so a stream's headers and first chunk wait for at most one engine
iteration, never for a token.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.serving.async_engine import RequestStream

HEADER = "X-Request-Id"


async def response_ids(prefix: str, streams: Sequence[RequestStream]) -> list[str]:
    """``<prefix>-<name>`` of each stream's request, once the engine reported them all. Raises what
    ended a request that has none (refused, the engine gone), having cancelled them all."""
    try:
        names = [await s.name() for s in streams]
    except BaseException:
        for s in streams:
            s.cancel()
        raise
    return [f"{prefix}-{name}" for name in names]


def id_header(ids: Sequence[str]) -> dict[str, str]:
    return {HEADER: ", ".join(ids)}
