"""Chrome-trace JSON of a log (open it in https://ui.perfetto.dev or chrome://tracing).

Track "engine": one slice per step (args: tokens, sequences). One track per request: queued
(arrival → admission), prefill (admission → first token) and decode (first token → finish).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from analysis.frames import LogFrames


def _us(t: float) -> float:
    return round(t * 1e6, 3)


def chrome_trace(frames: LogFrames) -> dict:
    events: list[dict] = [{"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "engine"}}]
    for row in frames.steps.itertuples(index=False):
        events.append({"ph": "X", "pid": 0, "tid": 0, "name": f"step {row.step}", "ts": _us(row.start),
                       "dur": _us(row.duration), "args": {"tokens": int(row.num_tokens),
                                                          "sequences": int(row.num_spans),
                                                          "prefill_tokens": int(row.prefill_tokens)}})
    for r in frames.requests.itertuples(index=False):
        tid = 1 + int(r.request_id)
        events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name",
                       "args": {"name": f"request {r.request_id}"}})
        phases = (("queued", r.arrival, r.admitted), ("prefill", r.admitted, r.first_token),
                  ("decode", r.first_token, r.finish))
        for name, a, b in phases:
            if not (math.isnan(a) or math.isnan(b)) and b >= a:
                events.append({"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": _us(a), "dur": _us(b - a),
                               "args": {"prompt_tokens": int(r.num_prompt_tokens),
                                        "output_tokens": int(r.num_output_tokens)}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(frames: LogFrames, path: Path) -> Path:
    path.write_text(json.dumps(chrome_trace(frames)))
    return path
