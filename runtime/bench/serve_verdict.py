"""Who fell behind in a ``bench serve`` run, from what both sides measured: the client's send lag
(how far behind its schedule it sent each request) against the engine's queueing (how long each
request waited between arriving at the server and its first admission, from the server's log).

A side is behind when its p99 lag passes ``LAG_MS``; when both are, the larger names the
bottleneck. Without the server's log only the client's side is known, and the line says so.
"""

from __future__ import annotations

LAG_MS = 50.0


def verdict(send_lag_p99_ms: float | None, queue_p99_ms: float | None) -> str | None:
    """One line, or None when the client kept its schedule and the engine's side is unknown."""
    lag = send_lag_p99_ms or 0.0
    if queue_p99_ms is None:
        if lag <= LAG_MS:
            return None
        return (f"the client sent requests late (send lag p99 {lag:,.0f} ms); the engine's queueing is unknown "
                "without the server's log (--launch records it)")
    queue = queue_p99_ms
    both = f"client send lag p99 {lag:,.0f} ms, engine queueing p99 {queue:,.0f} ms"
    if lag <= LAG_MS and queue <= LAG_MS:
        return f"bottleneck: neither side fell behind ({both})"
    if queue >= lag:
        return f"bottleneck: the server ({both}: requests waited for admission)"
    return f"bottleneck: the client ({both}: --client-processes N sends from more processes)"
