"""Step-time distribution of a recorded log: ``python -m runtime.bench.step_times LOG [--slow-ms 50]``.

Prints percentiles of step durations by kind (decode-only, with prefill), and the slow steps
(longer than ``--slow-ms``) with their shapes: a step slower than its token count explains is a
stall (a compile, a collection, a lock), which the serving benchmark looks for.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from analysis.frames import load_frames


def step_times(path: str, slow_ms: float = 50.0) -> dict:
    s = load_frames(path).steps
    ms = s["duration"].to_numpy(dtype=float) * 1e3
    kinds = {"all": np.ones(len(s), bool), "decode": (s["prefill_tokens"] == 0).to_numpy(),
             "with prefill": (s["prefill_tokens"] > 0).to_numpy()}
    out = {"steps": int(len(s)), "slow_ms": slow_ms, "by_kind": {}}
    for name, mask in kinds.items():
        v = ms[mask]
        if len(v):
            out["by_kind"][name] = {"steps": int(len(v)), "mean": float(v.mean()),
                                    **{f"p{p}": float(np.percentile(v, p)) for p in (50, 90, 99)},
                                    "max": float(v.max())}
    slow = s[ms > slow_ms]
    out["slow"] = [{"step": int(r.step), "ms": float(r.duration * 1e3), "tokens": int(r.num_tokens),
                    "prefill_tokens": int(r.prefill_tokens), "decode_seqs": int(r.decode_seqs)}
                   for r in slow.itertuples()]
    return out


def render(report: dict) -> str:
    lines = [f"{report['steps']:,} steps; step ms:"]
    for name, k in report["by_kind"].items():
        lines.append(f"  {name:<13}{k['steps']:>7,}  mean {k['mean']:7.2f}  p50 {k['p50']:7.2f}  p90 {k['p90']:7.2f}"
                     f"  p99 {k['p99']:7.2f}  max {k['max']:8.2f}")
    slow = report["slow"]
    lines.append(f"steps over {report['slow_ms']:g} ms: {len(slow)}")
    for r in slow[:20]:
        lines.append(f"  step {r['step']}: {r['ms']:.1f} ms, {r['tokens']} tokens "
                     f"({r['prefill_tokens']} prefill, {r['decode_seqs']} decodes)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.bench.step_times", description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="a recorded event log")
    p.add_argument("--slow-ms", type=float, default=50.0, help="a slower step is listed (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = p.parse_args(argv)
    report = step_times(args.log, args.slow_ms)
    print(render(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
