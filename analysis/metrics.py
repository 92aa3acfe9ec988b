"""Serving metrics from the frames of a log: latency percentiles, throughput, cache behaviour.

Definitions (times in seconds on the log's clock):
  TTFT   first_token - arrival
  TPOT   (finish - first_token) / (num_output_tokens - 1), requests with >= 2 output tokens
  E2E    finish - arrival (finished requests)
  queue  admitted - arrival (first admission)
  ITL    every gap between two consecutive token deliveries of a request (analysis/stalls.py)
  throughput   output tokens / makespan, makespan = last step end - first arrival
  prefix hit rate   Σ cached tokens at first admission / Σ prompt tokens of admitted requests

Percentiles are over the served requests (``requests`` counts those); refused ones (``Rejected``
events) are counted beside them (``rejected``, ``rejected_share``: analysis/rejected.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.frames import LogFrames
from analysis.rejected import rejected_summary, render_rejected
from analysis.stalls import STALL_FACTOR, gap_stats, render_stalls, stalls
from analysis.text_table import render_plain, table

PERCENTILES = (50, 90, 99)


def latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request ttft, tpot, e2e, queue, prefill columns (NaN where undefined); TTFT = queue +
    prefill (first admission to the end of the first token's step)."""
    r = requests
    done = r["status"] == "finished"
    out = pd.DataFrame({"request_id": r["request_id"]})
    out["ttft"] = r["first_token"] - r["arrival"]
    out["e2e"] = (r["finish"] - r["arrival"]).where(done)
    multi = done & (r["num_output_tokens"] >= 2)
    out["tpot"] = ((r["finish"] - r["first_token"]) / (r["num_output_tokens"] - 1)).where(multi)
    out["queue"] = r["admitted"] - r["arrival"]
    out["prefill"] = r["first_token"] - r["admitted"]
    return out


def percentiles(values: pd.Series, ps: tuple[int, ...] = PERCENTILES) -> dict[str, float]:
    v = values.dropna().to_numpy(dtype=float)
    if not len(v):
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in ps}, "max": float("nan")}
    return {"mean": float(v.mean()), **{f"p{p}": float(np.percentile(v, p)) for p in ps}, "max": float(v.max())}


def summarize(frames: LogFrames, stall_s: float | None = None, stall_factor: float = STALL_FACTOR) -> dict[str, Any]:
    """Everything the report shows of one log; ``stall_s``: the gap that counts as a decode stall
    (None: ``stall_factor`` × the run's median decode step, analysis/stalls.py)."""
    r, s = frames.requests, frames.steps
    lat = latencies(r)
    finished = r["status"] == "finished"
    out_tokens = int(r["num_output_tokens"].sum())
    start = float(r["arrival"].min()) if len(r) else 0.0
    end = float(s["end"].max()) if len(s) else start
    makespan = max(end - start, 0.0)
    admitted = r["num_cached_tokens"].notna()
    prompt_admitted = int(r.loc[admitted, "num_prompt_tokens"].sum())
    cached = int(r.loc[admitted, "num_cached_tokens"].sum())
    busy = float(s["duration"].sum()) if len(s) else 0.0
    return {
        "requests": int(len(r)),
        "finished": int(finished.sum()),
        "aborted": int((r["status"] == "aborted").sum()),
        "unfinished": int((r["status"] == "unfinished").sum()),
        "steps": int(len(s)),
        "makespan_s": makespan,
        "busy_fraction": busy / makespan if makespan > 0 else float("nan"),
        "output_tokens": out_tokens,
        "prompt_tokens": int(r["num_prompt_tokens"].sum()),
        "output_throughput_tok_s": out_tokens / makespan if makespan > 0 else float("nan"),
        "total_throughput_tok_s": (int(s["num_tokens"].sum()) if len(s) else 0) / makespan
        if makespan > 0 else float("nan"),
        "request_throughput_req_s": int(finished.sum()) / makespan if makespan > 0 else float("nan"),
        "preemptions": int(r["num_preemptions"].sum()),
        "prefix_hit_rate": cached / prompt_admitted if prompt_admitted else 0.0,
        "mean_batch_tokens": float(s["num_tokens"].mean()) if len(s) else float("nan"),
        "mean_step_s": float(s["duration"].mean()) if len(s) else float("nan"),
        "ttft_s": percentiles(lat["ttft"]),
        "tpot_s": percentiles(lat["tpot"]),
        "e2e_s": percentiles(lat["e2e"]),
        "queue_s": percentiles(lat["queue"]),
        "prefill_s": percentiles(lat["prefill"]),
        "itl_s": gap_stats(frames.gaps["gap"]),
        "stalls": stalls(frames, stall_s, factor=stall_factor),
        **rejected_summary(frames),
    }


def render_summary(summary: dict[str, Any], title: str = "summary") -> str:
    """A plain-text table of ``summarize`` output (analysis/text_table.py: also goes to files)."""
    cols = ("mean", *[f"p{p}" for p in PERCENTILES], "max")
    lat = table(("<latency (ms)", *cols), [
        (label, *(_num(summary[key].get(c, float("nan")) * 1e3, ",.1f") for c in cols))
        for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                           ("queue_s", "queue"), ("prefill_s", "admitted → 1st token"))
        if key in summary])  # a summary saved before ITL existed
    rejected = int(summary.get("rejected", 0))
    tot = table(("<metric", "value"), [
        ("requests (finished/aborted/unfinished/rejected)",
         f"{summary['requests'] + rejected:,} ({summary['finished']:,}/{summary['aborted']:,}/"
         f"{summary['unfinished']:,}/{rejected:,})"),
        ("steps", f"{summary['steps']:,}"),
        ("makespan", f"{summary['makespan_s']:,.1f} s (engine busy {_num(summary['busy_fraction'], '.0%')})"),
        ("output throughput", f"{_num(summary['output_throughput_tok_s'], ',.0f')} tok/s"),
        ("total throughput (prompt + output)", f"{_num(summary['total_throughput_tok_s'], ',.0f')} tok/s"),
        ("request throughput", f"{_num(summary['request_throughput_req_s'], ',.2f')} req/s"),
        ("preemptions", f"{summary['preemptions']:,}"),
        ("prefix hit rate", f"{summary['prefix_hit_rate']:.1%}"),
        ("mean step", f"{_num(summary['mean_step_s'] * 1e3, ',.2f')} ms, "
         f"{_num(summary['mean_batch_tokens'], ',.1f')} tokens"),
    ], show_header=False)
    # the rejections before any number: those are over the served ones only
    head = [render_rejected(summary)] if rejected and "rejected_share" in summary else []
    tail = [render_stalls(summary["stalls"])] if "stalls" in summary else []
    return render_plain(title, *head, lat, tot, *tail)


def _num(value: float, fmt: str) -> str:
    """``value`` formatted; "-" where it is undefined (NaN: no request got that far)."""
    return "-" if value != value else format(value, fmt)
