"""The acceptance section of ``minivllm analyze``: how a speculating engine's drafts fared.

From the log's rounds (traces/acceptance.py; a decode that verified drafts is a round):
  decodes drafted     rounds / decodes that had room for a draft
  drafts per round    draft tokens / rounds (K: the most a round proposes)
  acceptance rate     accepted drafts / draft tokens
  per position        alpha_j = P(draft j+1 accepted | drafts 1..j accepted), and the accepted
                      drafts at each position (vLLM's num_accepted_tokens_per_pos)
  tokens per round    tokens a round committed (accepted drafts + 1, less stops)
  tokens per decode   over every decode, speculating or not (1 without speculation)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traces.acceptance import AcceptanceEstimate, estimate, speculative_tokens
from traces.fleet_log import FleetLog, is_fleet
from traces.log import read_header


def acceptance_summary(path: str | Path) -> dict[str, Any] | None:
    """The section's numbers for the log at ``path``; None when it did not speculate."""
    header = read_header(path)
    if not speculative_tokens(header.config):
        return None
    if is_fleet(header):  # the replicas' rounds, one workload
        est = AcceptanceEstimate.merged([estimate(p) for p in FleetLog.read(path).replica_logs])
    else:
        est = estimate(path)
    c = est.workload
    rates = est.workload_rates()
    return {
        "num_tokens": est.num_tokens,
        "decodes": c.decodes,
        "rounds": c.rounds,
        "draft_tokens": c.draft_tokens,
        "accepted_tokens": c.accepted_tokens,
        "drafted_share": c.rounds / c.decodes if c.decodes else float("nan"),
        "drafts_per_round": c.draft_tokens / c.rounds if c.rounds else float("nan"),
        "acceptance_rate": c.accepted_tokens / c.draft_tokens if c.draft_tokens else float("nan"),
        "alpha": list(rates.alpha),
        "accepted_per_position": c.accepted + [0] * (len(rates.alpha) - len(c.accepted)),
        "tokens_per_round": c.round_tokens / c.rounds if c.rounds else float("nan"),
        "tokens_per_decode": c.decode_tokens / c.decodes if c.decodes else float("nan"),
    }


def render_acceptance(summary: dict[str, Any], title: str = "") -> str:
    s = summary
    head = f"speculative decoding (K={s['num_tokens']})" + (f", {title}" if title else "")
    if not s["rounds"]:
        return f"{head}: no decode was drafted for ({s['decodes']:,} decodes)\n"
    lines = [
        f"{head}: {s['rounds']:,} rounds of {s['decodes']:,} decodes drafted ({s['drafted_share']:.1%}), "
        f"{s['drafts_per_round']:.2f} drafts per round, acceptance rate {s['acceptance_rate']:.1%} "
        f"({s['accepted_tokens']:,} of {s['draft_tokens']:,} drafts)",
        f"  tokens per round {s['tokens_per_round']:.2f}, per decode {s['tokens_per_decode']:.2f}",
        "  per position: " + "  ".join(f"{j + 1}: α {a:.2f} ({n:,} accepted)"
                                       for j, (a, n) in enumerate(zip(s["alpha"], s["accepted_per_position"]))),
    ]
    return "\n".join(lines) + "\n"
