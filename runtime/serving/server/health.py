"""What /health answers: one engine is "ok" (200) or "dead" (503). A fleet (``serve
--data-parallel-size N``) also lists its replicas: "ok" with all of them up, "degraded" (still 200:
it serves) with some down, "down" (503) with none up but some starting again, "dead" (503) with
every one down for good.
"""

from __future__ import annotations

from typing import Any


def health(engine: Any) -> tuple[dict[str, Any], int]:
    """The body and status code of /health."""
    replica_health = getattr(engine, "replica_health", None)
    if replica_health is None:
        ok = engine.alive
        return {"status": "ok" if ok else "dead"}, 200 if ok else 503
    replicas = replica_health()
    states = [r["status"] for r in replicas]
    up = states.count("up")
    status = ("ok" if up == len(states) else "degraded" if up else
              "dead" if all(s == "failed" for s in states) else "down")
    return {"status": status, "replicas": replicas}, 200 if up else 503
