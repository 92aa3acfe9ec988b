"""Speculative decoding on the real model runner (CPU, tiny random models): greedy output equals
non-speculative greedy token for token whatever the drafter (prompt lookup, a drafter of chosen
acceptance, a draft model), in batches with preemption and prefix caching, the block invariants and
fold(log) == live state after every step; sampled output is the plain run's (the same streams) and
has the target's distribution; penalties and logprobs see the drafts; non-finite rows fail only
when committed; execute-replay of a speculative log reproduces it; build_engine wires the drafter."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch

from runtime.engine.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.drafters import parse_speculative
from runtime.executor.config import RunnerConfig
from runtime.executor.cuda_graphs import DecodeGraphs
from runtime.executor.draft_model import build_draft_drafter, check_compatible
from runtime.executor.model_inputs import as_decode_rows, host_inputs, to_device
from runtime.executor.model_runner import NONFINITE_LOGITS, ModelRunner
from runtime.executor.piecewise_graphs import PiecewiseGraphs
from tests.model_helpers import make_tiny, one_thread
from tests.sampling_reference import chi_square_ok, reference_probs
from tests.speculative_helpers import BLOCK, ReplayDrafter, by_prompt, drive, spec_rounds
from traces.events import BlockTrimmed, Preempted, PrefixHit, Step
from traces.params import SamplingParams

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny("llama", tmp_path_factory.mktemp("spec-llama"))


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A draft model that disagrees with the target (another architecture, same vocabulary)."""
    return make_tiny("qwen3", tmp_path_factory.mktemp("spec-qwen3"))


_rng = random.Random(5)
PREFIX = [_rng.randrange(320) for _ in range(9)]
PROMPTS = ([PREFIX + [_rng.randrange(320) for _ in range(n)] for n in (2, 5, 11)]
           + [[_rng.randrange(320) for _ in range(n)] for n in (6, 1, 15)] + [[7, 8, 9, 10] * 3])
GREEDY = SamplingParams(max_tokens=22, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(tiny):
    outputs, _, events, core, _ = drive(tiny.loaded, PROMPTS, GREEDY)
    return outputs


DRAFTERS = ["ngram:4", "replay@0.6:4", "replay@1:3", "model:self:3", "model:other:3"]


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_output_equals_plain_greedy(tiny, other, plain, name):
    """Batches with preemption (a small pool) and prefix hits (a shared 9-token prefix); drafts
    accepted, rejected and all accepted (the bonus token); blocks trimmed after rejections."""
    method, _, arg = name.partition(":")
    drafter = None
    if method.startswith("replay@"):
        rate = float(method.split("@")[1])
        drafter = ReplayDrafter(by_prompt(PROMPTS, plain), int(arg), rate)
        speculative = f"ngram:{arg}"
    elif method == "model":
        which, k = arg.split(":")
        folder = (tiny if which == "self" else other).folder
        speculative = f"model:{folder}:{k}"
        drafter = build_draft_drafter(parse_speculative(speculative), tiny.loaded, block_size=BLOCK, num_blocks=28,
                                      max_model_len=128, max_num_seqs=6)
    else:
        speculative = name
    outputs, _, events, core, _ = drive(tiny.loaded, PROMPTS, GREEDY, speculative=speculative, drafter=drafter)
    assert outputs == plain
    assert any(isinstance(e, Preempted) for e in events), "the small pool should preempt"
    assert any(isinstance(b, PrefixHit) for e in events if hasattr(e, "block_events") for b in e.block_events)
    r = spec_rounds(events)
    proposed, accepted = sum(p for _, p, _ in r), sum(a for _, _, a in r)
    assert proposed > 0
    if name in ("replay@1:3", "model:self:3"):
        assert accepted == proposed
        assert sum(isinstance(e, Step) for e in events) < 0.6 * sum(map(len, plain.values()))
    elif name in ("replay@0.6:4",):
        assert 0 < accepted < proposed
        assert any(isinstance(b, BlockTrimmed) for e in events if isinstance(e, Step) for b in e.block_events)
    elif name == "model:other:3":
        assert accepted < proposed
    if method == "model":
        assert drafter.stats["rounds"] > 0 and drafter.stats["forwards"] >= drafter.stats["rounds"]


def test_prefix_hits_under_speculation(tiny, plain):
    """Requests sharing a prefix, admitted over several steps: the later ones hit the blocks the
    earlier ones computed, including blocks filled by accepted drafts."""
    drafter = ReplayDrafter(by_prompt(PROMPTS, plain), 4, 0.7)
    outputs, _, events, core, _ = drive(tiny.loaded, PROMPTS, GREEDY, speculative="ngram:4", drafter=drafter,
                                        num_blocks=96, budget=12, max_num_seqs=3)
    assert outputs == plain
    assert any(isinstance(b, PrefixHit) for e in events if hasattr(e, "block_events") for b in e.block_events)


def _graph_path_runner(tiny) -> ModelRunner:
    """A CPU runner of the graph-path dry runs: steps of 16 tokens, up to 6 sequences, ngram:3."""
    config = EngineConfig(cache=CacheConfig(block_size=BLOCK, num_blocks=48),
                          scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=6, max_model_len=128),
                          speculative="ngram:3", seed=3)
    return ModelRunner(tiny.loaded, RunnerConfig(attention_backend="torch", device="cpu"), config)


def test_piecewise_graph_path_dry_run(tiny, plain):
    """Speculating steps through PiecewiseGraphs (its dry run on the CPU: the same buffers and
    padding): their logits rows (1 + drafts per decode) fit ``max_num_seqs`` rows."""
    drafter = ReplayDrafter(by_prompt(PROMPTS, plain), 3, 0.5)
    runner = _graph_path_runner(tiny)
    runner.piecewise = PiecewiseGraphs(runner.model, runner.kv_caches, runner.backend, max_tokens=16, max_seqs=16,
                                       device=runner.device)
    outputs, *_ = drive(tiny.loaded, PROMPTS, GREEDY, speculative="ngram:3", drafter=drafter, runner=runner)
    assert outputs == plain and runner.piecewise.replays > 0


SAMPLED = [SamplingParams(max_tokens=20, temperature=0.9, top_k=40, ignore_eos=True, logprobs=2),
           SamplingParams(max_tokens=18, temperature=1.3, top_p=0.8, min_p=0.02, seed=11, ignore_eos=True),
           SamplingParams(max_tokens=20, temperature=0.0, repetition_penalty=1.4, presence_penalty=0.5,
                          frequency_penalty=0.3, ignore_eos=True, logprobs=3),
           SamplingParams(max_tokens=16, temperature=0.7, frequency_penalty=1.0, seed=4, ignore_eos=True,
                          logprobs=0)]


@pytest.mark.parametrize("rate", [0.3, 0.8])
def test_sampled_output_and_logprobs_equal_the_plain_run(tiny, rate):
    """A row per position, sampled as a decode would be (its own stream, penalties over the
    history and the drafts before it); the uniforms of rows after the committed one go back to the
    stream, so a request samples the very tokens of a run without speculation; logprobs: one per
    committed token, its row's."""
    params = [SAMPLED[i % len(SAMPLED)] for i in range(len(PROMPTS))]
    plain, plain_lps, *_ = drive(tiny.loaded, PROMPTS, params)
    drafter = ReplayDrafter(by_prompt(PROMPTS, plain), 4, rate)
    spec, spec_lps, events, *_ = drive(tiny.loaded, PROMPTS, params, speculative="ngram:4", drafter=drafter)
    assert spec == plain
    r = spec_rounds(events)
    assert 0 < sum(a for _, _, a in r) < sum(p for _, p, _ in r)
    for i in plain:
        assert len(spec_lps[i]) == len(plain_lps[i]) == (len(plain[i]) if params[i].logprobs is not None else 0)
        for got, want, token in zip(spec_lps[i], plain_lps[i], plain[i]):
            assert list(got) == list(want) and next(iter(got)) == token
            assert np.allclose(list(got.values()), list(want.values()), atol=1e-4)


def test_sampled_tokens_have_the_targets_distribution(tiny):
    """Many seeds, one prompt, a 3-token top-k: the joint of the first three tokens (the second
    and third verified against a greedy draft model: accepted when the sample agrees) against the
    target's own probabilities, chi-square."""
    prompt = [5, 17, 33, 2, 91]
    n = 2500
    params = [SamplingParams(max_tokens=4, temperature=1.0, top_k=3, seed=s, ignore_eos=True) for s in range(n)]
    spec = parse_speculative(f"model:{tiny.folder}:2")
    drafter = build_draft_drafter(spec, tiny.loaded, block_size=BLOCK, num_blocks=1200, max_model_len=128,
                                  max_num_seqs=256)
    config = EngineConfig(cache=CacheConfig(block_size=BLOCK, num_blocks=1200),
                          scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=128),
                          speculative=str(spec))
    runner = ModelRunner(tiny.loaded, RunnerConfig(attention_backend="torch", device="cpu"), config)
    core = EngineCore(config, drafter=drafter)
    for p in params:
        core.add_request(prompt, p, 0.0)
    outputs: dict[int, list[int]] = {}
    accepted = proposed = 0
    while core.has_unfinished():
        out = core.step(0.0, runner)
        drafts = out.plan.drafts or {}
        for d in out.deltas:
            outputs.setdefault(d.request_id, []).extend(d.new_token_ids)
            if d.request_id in drafts:
                proposed += len(drafts[d.request_id])
                accepted += len(d.new_token_ids) - 1
    assert 0 < accepted < proposed

    @torch.inference_mode()
    def probs(prefix):
        logits = tiny.hf(torch.tensor([prompt + prefix])).logits[0, -1].double().numpy()
        return reference_probs(logits, params[0])

    expected = {}
    p1 = probs([])
    for a in np.flatnonzero(p1):
        p2 = probs([int(a)])
        for b in np.flatnonzero(p2):
            p3 = probs([int(a), int(b)])
            for c in np.flatnonzero(p3):
                expected[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    keys = sorted(expected)
    counts = np.zeros(len(keys))
    index = {k: i for i, k in enumerate(keys)}
    for toks in outputs.values():
        counts[index[tuple(toks[:3])]] += 1
    ok, stat, crit = chi_square_ok(counts, np.array([expected[k] for k in keys]))
    assert ok, f"chi2 {stat:.1f} >= {crit:.1f}"


class _NaNRow:
    """The model, with the logits of chosen rows of speculating steps made NaN."""

    def __init__(self, model, rows):
        self.model, self.rows, self.spec = model, rows, model.spec

    def __call__(self, *args):
        logits = self.model(*args)
        if logits.shape[0] > 1:
            logits = logits.clone()
            for r in self.rows(logits.shape[0]):
                logits[r] = float("nan")
        return logits


@pytest.mark.parametrize("where", ["committed", "after"])
def test_nonfinite_rows_fail_the_request_only_when_committed(tiny, plain, where):
    """One speculating request: drafts all right (rows 0..D committed) or the first wrong (only row
    0 committed); row D's logits NaN."""
    prompt = PROMPTS[3]
    rate = 1.0 if where == "committed" else 0.0
    drafter = ReplayDrafter(by_prompt(PROMPTS, plain), 2, rate)
    config = EngineConfig(cache=CacheConfig(block_size=BLOCK, num_blocks=32),
                          scheduler=SchedulerConfig(max_num_batched_tokens=16, max_model_len=128),
                          speculative="ngram:2")
    runner = ModelRunner(tiny.loaded, RunnerConfig(attention_backend="torch", device="cpu"), config)
    runner.model = _NaNRow(runner.model, lambda rows: [rows - 1])
    core = EngineCore(config, drafter=drafter)
    core.add_request(prompt, GREEDY, 0.0)
    core.step(0.0, runner)  # the prefill: one row
    plan = core.schedule(0.0)
    assert plan.drafts and len(plan.drafts[0]) == 2
    result = runner.execute(plan, core.requests)
    assert (result.failed == {0: NONFINITE_LOGITS}) == (where == "committed")
    assert result.failed is None or where == "committed"
    assert all(0 <= t < tiny.loaded.spec.vocab_size for t in result.token_ids[0])


def test_host_inputs_of_a_speculating_span(tiny):
    """Its input is the last token then the drafts; its logits rows are its last D + 1 positions,
    in plan order beside a decode and a prefill chunk."""
    from runtime.engine.request import Request
    from runtime.engine.types import StepPlan
    from traces.events import Span

    def req(rid, tokens):
        from array import array

        return Request(rid, array("i", tokens), GREEDY, 0.0, 128)

    reqs = {0: req(0, [1, 2, 3, 4, 5]), 1: req(1, [9, 8, 7]), 2: req(2, list(range(10, 20)))}
    spans = [Span(0, 4, 3, True), Span(1, 2, 1, True), Span(2, 0, 6, False)]
    plan = StepPlan(0, spans, [[0, 1], [2], [3, 4]], [], [], 10, 2, {0: [6, 7]})
    host = host_inputs(plan, reqs, BLOCK)
    # batch order: the decode (r1) first, then r0's span, then r2's chunk
    assert host.input_ids.tolist() == [7, 5, 6, 7, 10, 11, 12, 13, 14, 15]
    assert host.positions.tolist()[:4] == [2, 4, 5, 6]
    assert host.logits_indices.tolist() == [1, 2, 3, 0] and host.rows_per_sample == [3, 1]


def test_the_draft_model_forgets_finished_requests_and_fits_its_pool(tiny, plain):
    """Its pool smaller than the running requests' tokens: the least recently drafted lose their
    draft KV, a request that can't fit gets no drafts; greedy output is unchanged either way."""
    spec = parse_speculative(f"model:{tiny.folder}:3")
    drafter = build_draft_drafter(spec, tiny.loaded, block_size=BLOCK, num_blocks=4, max_model_len=128,
                                  max_num_seqs=2)
    assert drafter.num_blocks == 4 + 2
    outputs, _, events, core, _ = drive(tiny.loaded, PROMPTS, GREEDY, speculative=str(spec), drafter=drafter)
    assert outputs == plain
    assert drafter.stats["unfit"] + drafter.stats["evicted"] > 0 and drafter.stats["rounds"] > 0
    assert not drafter._seqs or all(not s.request.status.done for s in drafter._seqs.values())
    drafter.propose([], [])  # the next round forgets the finished ones
    assert not drafter._seqs and drafter.bm.num_used_blocks == 0


def test_check_compatible_names_what_differs():
    spec = parse_speculative("model:/d:3")

    def model(vocab, tokens=None, positions=512):
        tok = None if tokens is None else types.SimpleNamespace(get_vocab=lambda: tokens)
        return types.SimpleNamespace(tokenizer=tok, spec=types.SimpleNamespace(vocab_size=vocab), path="/d",
                                     model=types.SimpleNamespace(rotary=types.SimpleNamespace(max_positions=positions)))

    check_compatible(spec, model(320), model(320), 128)
    check_compatible(spec, model(330, {"a": 0}), model(320, {"a": 0}), 128)  # same tokenizer, padded vocab
    with pytest.raises(ConfigError, match="^speculative model:/d:3: .*another tokenizer"):
        check_compatible(spec, model(320, {"a": 0}), model(320, {"b": 0}), 128)
    with pytest.raises(ConfigError, match="^speculative .*vocabulary of 49152 tokens"):
        check_compatible(spec, model(49152), model(320), 128)
    with pytest.raises(ConfigError, match="64 positions"):
        check_compatible(spec, model(320, positions=64), model(320), 128)


def test_build_engine_wires_the_drafter(tiny, other):
    from runtime.engine.drafters import ThrottledDrafter
    from runtime.executor.draft_model import DraftModelDrafter
    from runtime.executor.setup import build_engine

    parts = build_engine(loaded=tiny.loaded, speculative=f"model:{other.folder}:3", num_blocks=40, block_size=4,
                         max_model_len=128)
    assert isinstance(parts.drafter, ThrottledDrafter) and isinstance(parts.drafter.inner, DraftModelDrafter)
    assert parts.drafter.num_tokens == 3
    assert parts.drafter.num_blocks == 40 + 256  # K=3 <= one block past each running request's tokens
    core = parts.core()
    assert core.drafter is parts.drafter
    ngram = build_engine(loaded=tiny.loaded, speculative="ngram:2", num_blocks=40)
    assert ngram.drafter is None and ngram.core().drafter.num_tokens == 2
    with pytest.raises(ConfigError, match="^speculative model:random:smollm2-135m:3: .*vocabulary of 49152"):
        build_engine(loaded=tiny.loaded, speculative="model:random:smollm2-135m:3", num_blocks=40)
    with pytest.raises(ConfigError, match="^speculative model:/nowhere:3: the draft model does not load"):
        build_engine(loaded=tiny.loaded, speculative="model:/nowhere:3", num_blocks=40)
    with pytest.raises(ConfigError, match="^speculative "):
        build_engine(loaded=tiny.loaded, speculative="ngram:99", num_blocks=40)


def test_kv_budget_is_shared_with_the_draft_pool(tiny, other):
    from runtime.executor.kv_cache import block_bytes
    from runtime.executor.setup import build_engine

    plain = build_engine(loaded=tiny.loaded, kv_cache_gb=0.01, block_size=4, max_num_seqs=8).config.cache.num_blocks
    parts = build_engine(loaded=tiny.loaded, kv_cache_gb=0.01, block_size=4, max_num_seqs=8,
                         speculative=f"model:{other.folder}:4")
    t, d = block_bytes(tiny.loaded.spec, torch.float32, 4), block_bytes(other.loaded.spec, torch.float32, 4)
    got = parts.config.cache.num_blocks
    assert got == (int(0.01 * 2**30) - 8 * d) // (t + d) < plain
    assert got * t + parts.drafter.num_blocks * d <= 0.01 * 2**30


def test_model_random_draft_greedy_equals_plain(tmp_path):
    """``model:random:smollm2-135m:3``: a random draft of real shape (49,152 tokens) for a tiny
    target of that vocabulary."""
    target = make_tiny("llama", tmp_path / "t", vocab_size=49152)
    prompts = [PROMPTS[0], PROMPTS[4]]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    plain, *_ = drive(target.loaded, prompts, params)
    spec = parse_speculative("model:random:smollm2-135m:3")
    drafter = build_draft_drafter(spec, target.loaded, block_size=BLOCK, num_blocks=48, max_model_len=128,
                                  max_num_seqs=6)
    outputs, _, events, *_ = drive(target.loaded, prompts, params, speculative=str(spec), drafter=drafter)
    assert outputs == plain and drafter.stats["rounds"] > 0
    assert sum(p for _, p, _ in spec_rounds(events)) > 0


@pytest.mark.parametrize("speculative", ["model:self:3", "model:other:2"])
def test_execute_replay_of_a_speculative_log(tmp_path, tiny, other, speculative):
    """A log recorded by ``LLM`` with speculation (sampled and greedy requests, preemptions) replays
    token for token on a fresh model runner (the drafts come from the log: no drafter needed)."""
    from runtime.cli import main
    from runtime.executor.setup import replay_executor_factory
    from runtime.serving.llm import LLM
    from simulator.replay.execute import execute_replay
    from traces.log import read_log

    speculative = speculative.replace("self", str(tiny.folder)).replace("other", str(other.folder))
    log = tmp_path / "spec.jsonl"
    llm = LLM(str(tiny.folder), trace=str(log), device="cpu", dtype="float32", num_blocks=16, block_size=4,
              max_num_batched_tokens=24, max_num_seqs=4, max_model_len=128, seed=7, speculative=speculative)
    prompts = [[(7 * i + 3 * j) % 320 for j in range(n)] for i, n in enumerate((9, 23, 14, 30, 5, 17))]
    prompts[4] = [4, 5, 6, 7] * 4
    params = [SamplingParams(max_tokens=14, temperature=0.9, top_k=50, ignore_eos=True, presence_penalty=0.3),
              SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=1)] * 3
    llm.generate(prompts, params, use_tqdm=False)
    llm.close()
    events = list(read_log(log))
    assert events[0].config["speculative"] == speculative
    assert any(isinstance(e, Preempted) for e in events)
    assert sum(p for _, p, _ in spec_rounds(events)) > 0

    report = execute_replay(log, replay_executor_factory(device="cpu"))
    assert report.ok, report.first and report.first.context
    assert report.compared_tokens == sum(len(t) for e in events if isinstance(e, Step) for t in e.tokens)
    assert main(["replay", str(log), "--execute", "--device", "cpu", "--no-progress"]) == 0


def test_warm_up_shares_the_draft_model_and_forgets_its_requests(tiny):
    """A server's warm-up runs on a scratch core: with a draft model it drafts too (the drafter is
    the executor's, shared), and the served core starts with none of its requests."""
    from runtime.serving.llm_engine import LLMEngine
    from runtime.serving.warmup import warm_up

    engine = LLMEngine(str(tiny.folder), device="cpu", block_size=4, num_blocks=64, max_model_len=128,
                       speculative=f"model:{tiny.folder}:2")
    drafter = engine.core.drafter
    assert drafter is engine.parts.drafter
    warm_up(engine)
    assert drafter.stats["rounds"] > 0 and not drafter._seqs and drafter.bm.num_used_blocks == 0
    rid = engine.add_request([3, 4, 5, 6], max_tokens=6, temperature=0, ignore_eos=True)
    ids = []
    while not engine.is_finished(rid):
        for out in engine.step():
            ids += out.token_ids
    assert ids == tiny.reference([3, 4, 5, 6], 6)


def test_decode_graph_path_dry_run(tiny, plain):
    """Verify steps through the decode graphs' buffers (their dry run on the CPU), a row per token:
    greedy output equals plain, and the graphs ran steps with drafts in them."""
    drafter = ReplayDrafter(by_prompt(PROMPTS, plain), 3, 0.5)
    runner = _graph_path_runner(tiny)
    runner.graphs = DecodeGraphs(runner.model, runner.kv_caches, runner.backend, max_batch=24, max_model_len=128,
                                 block_size=BLOCK, device=runner.device)
    runner.graphs.capture()
    verified = []
    real_run = runner.graphs.run

    def run(host, previous_ids=None):
        verified.append(host.rows_per_sample is not None)
        return real_run(host, previous_ids)

    runner.graphs.run = run
    outputs, _, events, *_ = drive(tiny.loaded, PROMPTS, GREEDY, speculative="ngram:3", drafter=drafter,
                                   runner=runner)
    assert outputs == plain
    assert sum(verified) > 10 and sum(a for _, _, a in spec_rounds(events)) > 0


def test_decode_rows_give_the_varlen_steps_logits(tiny):
    """A step of a decode and two verify spans: its logits through ``as_decode_rows`` (a decode row
    per token, the order restored) equal the varlen step's; a step with a prefill chunk has no
    decode rows."""
    from array import array

    from runtime.engine.request import Request
    from runtime.engine.types import StepPlan
    from traces.events import Span

    config = EngineConfig(cache=CacheConfig(block_size=BLOCK, num_blocks=32),
                          scheduler=SchedulerConfig(max_num_seqs=16, max_model_len=64), speculative="ngram:3")
    runner = ModelRunner(tiny.loaded, RunnerConfig(attention_backend="torch", device="cpu"), config)
    graphs = DecodeGraphs(runner.model, runner.kv_caches, runner.backend, max_batch=16, max_model_len=64,
                          block_size=BLOCK, device=runner.device)
    graphs.capture()
    rng = random.Random(2)
    lens = {0: 9, 1: 6, 2: 13}
    reqs = {rid: Request(rid, array("i", [rng.randrange(320) for _ in range(n)]), GREEDY, 0.0, 64)
            for rid, n in lens.items()}
    tables = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    prefill = StepPlan(0, [Span(rid, 0, n - 1, False) for rid, n in lens.items()], tables, [], [], 25, 0)
    host = host_inputs(prefill, reqs, BLOCK)
    assert as_decode_rows(host) is None
    with torch.inference_mode():
        inp = to_device(host, runner.device)
        runner.model(inp.input_ids, inp.positions, runner.kv_caches, inp.meta, runner.backend, inp.logits_indices)
        # request 0 verifies 3 drafts, 1 decodes, 2 verifies 2: the decode moves first in batch order
        spans = [Span(0, 8, 4, True), Span(1, 5, 1, True), Span(2, 12, 3, True)]
        plan = StepPlan(1, spans, tables, [], [], 8, 3, {0: [5, 6, 7], 2: [8, 9]})
        host = host_inputs(plan, reqs, BLOCK)
        rows = as_decode_rows(host)
        assert rows.decode_only and rows.seq_lens.tolist() == (host.positions + 1).tolist()
        assert rows.logits_indices.tolist() == [1, 2, 3, 4, 0, 5, 6, 7]
        inp = to_device(host, runner.device)
        varlen = runner.model(inp.input_ids, inp.positions, runner.kv_caches, inp.meta, runner.backend,
                              inp.logits_indices)
        graphed = graphs.run(rows)
    torch.testing.assert_close(graphed, varlen, rtol=1e-4, atol=1e-5)
