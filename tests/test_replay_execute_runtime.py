"""Execute-replay on the real model runtime (CPU, tiny random model): a log recorded by ``LLM``
with sampling, chunked prefill and preemptions replays token for token."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_llm_log_replays_token_for_token_on_the_model_runner(tmp_path):
    from runtime.executor.setup import replay_executor_factory
    from runtime.serving.llm import LLM
    from simulator.replay.execute import execute_replay
    from tests.model_helpers import tiny_hf_model
    from traces.events import Preempted, Step
    from traces.log import read_log
    from traces.params import SamplingParams

    folder = tmp_path / "tiny-qwen3"
    tiny_hf_model("qwen3").save_pretrained(folder)
    log = tmp_path / "run.jsonl"
    llm = LLM(str(folder), trace=str(log), device="cpu", dtype="float32", num_blocks=14, block_size=4,
              max_num_batched_tokens=24, max_num_seqs=4, max_model_len=128, seed=7)
    prompts = [[(7 * i + 3 * j) % 320 for j in range(n)] for i, n in enumerate((9, 23, 14, 30, 5, 17))]
    params = [SamplingParams(max_tokens=10, temperature=0.9, top_k=50, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * 3
    llm.generate(prompts, params, use_tqdm=False)
    llm.close()
    events = list(read_log(log))
    assert any(isinstance(e, Preempted) for e in events), "the small KV pool should force preemptions"

    report = execute_replay(log, replay_executor_factory(device="cpu"))
    assert report.ok, report.first and report.first.context
    assert report.steps == sum(isinstance(e, Step) for e in events)
    assert report.compared_tokens == sum(len(t) for e in events if isinstance(e, Step) for t in e.tokens)

    # a different engine seed samples differently: the first sampled-with-temperature step diverges
    other = execute_replay(log, lambda h: replay_executor_factory(device="cpu")(
        __import__("msgspec").structs.replace(h, seed=h.seed + 1)))
    assert not other.ok and other.first.request_id % 2 == 0

    from runtime.cli import main

    assert main(["replay", str(log), "--execute", "--device", "cpu", "--no-progress"]) == 0

    # the live log re-simulated with its own durations, gaps and tokens: the same decisions
    from simulator.cost.recorded_model import RecordedCostModel
    from simulator.replay.replay import resimulate
    from tests.sim_helpers import recorded_tokens
    from traces.events import Admitted, Finished

    sim: list = []
    resimulate(log, RecordedCostModel.from_log(log), sink=sim.append, token_fn=recorded_tokens(log))
    kinds = Step | Admitted | Preempted | Finished
    pick = lambda evs: [(e.step, e.spans, e.tokens, e.block_events) if isinstance(e, Step) else
                        (type(e).__name__, e.request_id) for e in evs if isinstance(e, kinds)]
    assert pick(sim) == pick(events)
