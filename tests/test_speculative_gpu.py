"""Speculative decoding on CUDA (fp32 tiny models, so greedy choices are not decided by rounding):
with Triton attention and CUDA graphs on, speculating steps go through the decode graphs, a row per
token (steps with a prefill chunk through the piecewise graphs, the draft model's one-token steps
through its own), and greedy output equals HF's greedy and the plain run's; sampled output equals
the plain run's with either sampler."""

from __future__ import annotations

import random

import pytest
import torch

from runtime.engine.drafters import parse_speculative
from runtime.executor.config import RunnerConfig
from runtime.executor.draft_model import build_draft_drafter
from runtime.executor.model.loader import load_model
from runtime.executor.model_runner import ModelRunner
from tests.model_helpers import make_tiny, run_engine
from tests.speculative_helpers import ReplayDrafter, by_prompt, drive, spec_rounds
from traces.params import SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny_gpu(request, tmp_path_factory):
    tiny = make_tiny(request.param, tmp_path_factory.mktemp(f"spec-gpu-{request.param}"))
    tiny.hf.to("cuda")
    tiny.loaded = load_model(str(tiny.folder), device="cuda", dtype="float32")
    return tiny


def _prompts(seed, lengths, vocab=320):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


SCENARIOS = {
    "mixed_batch": dict(lengths=[1, 5, 16, 17, 40, 3, 64], max_tokens=[12, 20, 7, 16, 10, 25, 9], kw={}),
    "preemption": dict(lengths=[20, 18, 25, 12, 30], max_tokens=[30, 28, 24, 30, 20], kw=dict(num_blocks=36)),
}


@pytest.mark.parametrize("drafter", ["replay@0.6", "model:self", "ngram"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_greedy_equals_hf_with_triton_and_graphs(tiny_gpu, scenario, drafter):
    sc = SCENARIOS[scenario]
    prompts = _prompts(list(SCENARIOS).index(scenario), sc["lengths"])
    refs = [tiny_gpu.reference(p, n) for p, n in zip(prompts, sc["max_tokens"])]
    k = 3
    if drafter == "replay@0.6":
        made, speculative = ReplayDrafter({tuple(p): r for p, r in zip(prompts, refs)}, k, 0.6), f"ngram:{k}"
    elif drafter == "model:self":
        speculative = f"model:{tiny_gpu.folder}:{k}"
        made = build_draft_drafter(parse_speculative(speculative), tiny_gpu.loaded, block_size=4,
                                   num_blocks=sc["kw"].get("num_blocks", 256), max_model_len=512, max_num_seqs=256,
                                   attention_backend="triton")
        assert made.graphs is not None
    else:
        made, speculative = None, f"ngram:{k}"
    verified = []
    real_init = ModelRunner.__init__

    def counting(self, *a, **kw):  # count the decode-graph replays of steps with drafts
        real_init(self, *a, **kw)
        replay = self.graphs.run

        def run(host, ids=None):
            verified.append(host.rows_per_sample is not None)
            return replay(host, ids)

        self.graphs.run = run

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelRunner, "__init__", counting)
        run = run_engine(tiny_gpu.loaded, prompts, sc["max_tokens"], device="cuda", attention_backend="triton",
                         speculative=speculative, drafter=made, **sc["kw"])
    assert run.outputs == refs
    assert run.runner.piecewise.replays > 0
    assert sum(verified) > 0 or drafter == "ngram"  # (prompt lookup may find nothing in random tokens)
    if scenario == "preemption":
        assert run.preemptions > 0
    if drafter == "model:self":
        assert made.graphs.replays > 0 and made.stats["rounds"] > 0


@pytest.mark.parametrize("sampler", ["torch", "triton"])
def test_sampled_equals_the_plain_run_on_cuda(tiny_gpu, sampler):
    prompts = _prompts(3, [4, 9, 17, 30, 2])
    params = [SamplingParams(max_tokens=16, temperature=0.9, top_k=40, top_p=0.9, ignore_eos=True, seed=i,
                             presence_penalty=0.2 * (i % 2), logprobs=1 if i % 3 == 0 else None)
              for i in range(len(prompts))]
    rc = RunnerConfig(device="cuda", attention_backend="triton", sampler=sampler)
    plain, plain_lps, *_ = drive(tiny_gpu.loaded, prompts, params, runner_config=rc, num_blocks=128)
    drafter = ReplayDrafter(by_prompt(prompts, plain), 4, 0.6)
    spec, spec_lps, events, *_ = drive(tiny_gpu.loaded, prompts, params, speculative="ngram:4", drafter=drafter,
                                       runner_config=rc, num_blocks=128)
    assert spec == plain
    assert sum(a for _, _, a in spec_rounds(events)) > 0
    assert {i: [list(d) for d in v] for i, v in spec_lps.items()} == {i: [list(d) for d in v]
                                                                     for i, v in plain_lps.items()}
