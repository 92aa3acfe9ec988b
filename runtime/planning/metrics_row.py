"""One simulated point's metrics as a flat row: the summary of its frames (analysis.metrics.summarize,
what ``simulate`` prints) with latencies in milliseconds, and goodput under an SLO."""

from __future__ import annotations

from typing import Any

from analysis.frames import LogFrames
from analysis.metrics import latencies, summarize
from runtime.planning.slo import STATS, Slo

LATENCIES = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "queue": "queue_s", "itl": "itl_s"}
SCALARS = ("requests", "finished", "aborted", "unfinished", "rejected", "rejected_share", "steps", "makespan_s",
           "busy_fraction", "output_tokens", "prompt_tokens", "output_throughput_tok_s", "total_throughput_tok_s",
           "request_throughput_req_s", "preemptions", "prefix_hit_rate", "mean_batch_tokens")


def metrics_row(frames: LogFrames, replicas: int, slo: Slo | None) -> dict[str, Any]:
    """Every latency, throughput and goodput figure of a run, by column name."""
    summary = summarize(frames)
    row: dict[str, Any] = {k: summary[k] for k in SCALARS}
    row["mean_step_ms"] = summary["mean_step_s"] * 1e3
    for metric, key in LATENCIES.items():
        for stat in STATS:
            row[f"{metric}_{stat}_ms"] = summary[key][stat] * 1e3
    row["stall_gaps"] = summary["stalls"]["count"]
    row["stall_requests"] = summary["stalls"]["requests"]
    row["output_throughput_per_replica_tok_s"] = row["output_throughput_tok_s"] / replicas
    if slo is not None:
        r = frames.requests
        good = slo.good_requests(latencies(r), r["status"] == "finished")
        makespan = row["makespan_s"]
        offered = row["requests"] + row["rejected"]
        row["goodput_req_s"] = good / makespan if makespan > 0 else 0.0
        row["goodput_per_replica_req_s"] = row["goodput_req_s"] / replicas
        row["slo_attainment"] = good / offered if offered else 0.0
        broken = slo.violations(row)
        row["meets_slo"] = not broken
        row["slo_violations"] = "; ".join(broken)
    return row
