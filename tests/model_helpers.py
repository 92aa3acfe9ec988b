"""Tiny random-weight HF models (Llama, Qwen2, Qwen3) saved as HF folders, HF greedy references,
and a driver that runs prompts through EngineCore + ModelRunner and reports what happened."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.step_loop import StepLoop
from runtime.executor.config import RunnerConfig
from runtime.executor.model.loader import LoadedModel, load_model
from runtime.executor.model_runner import ModelRunner
from runtime.executor.piecewise_graphs import PiecewiseGraphs
from traces.params import SamplingParams

# hidden 64, 2 layers, 4 heads over 2 KV heads (GQA); a larger init spreads the logits so greedy
# choices are not decided by rounding
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=512,
            initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def tiny_hf_model(arch: str, **overrides):
    import transformers

    cls_name, cfg_name = {"llama": ("LlamaForCausalLM", "LlamaConfig"),
                          "qwen2": ("Qwen2ForCausalLM", "Qwen2Config"),
                          "qwen3": ("Qwen3ForCausalLM", "Qwen3Config")}[arch]
    kw = dict(TINY)
    kw["tie_word_embeddings"] = arch != "llama"  # cover tied and untied
    kw.update(overrides)
    config = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3}[arch])
    model = getattr(transformers, cls_name)(config).eval()
    if arch == "qwen2":  # HF initialises biases to zero: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.2)
    if arch == "qwen3":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module", autouse=False)
def one_thread():
    """Tiny models are all overhead: one thread avoids OpenMP barriers (and spinning against other
    jobs on a shared CPU). Import it into a test module and mark it autouse there."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@dataclass
class TinyModel:
    arch: str
    hf: object
    folder: Path
    loaded: LoadedModel
    _refs: dict = field(default_factory=dict)

    def reference(self, prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in self._refs:
            self._refs[key] = hf_greedy(self.hf, prompt, max_tokens)
        return self._refs[key]


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def save_tiny_tokenizer(folder: Path) -> None:
    """A byte-level BPE (~317 tokens, fits TINY's vocab) trained in code, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY["vocab_size"], special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog. Hello world! 你好，世界 🙂"] * 50,
                            trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def make_tiny(arch: str, folder: Path, tokenizer: bool = False, **overrides) -> TinyModel:
    hf = tiny_hf_model(arch, **overrides)
    hf.save_pretrained(folder)
    if tokenizer:
        save_tiny_tokenizer(folder)
    return TinyModel(arch, hf, folder, load_model(str(folder), device="cpu", dtype="float32"))


@torch.inference_mode()
def hf_greedy(hf, prompt: list[int], max_tokens: int) -> list[int]:
    ids = torch.tensor([prompt], device=hf.device)
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                      do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@dataclass
class EngineRun:
    outputs: list[list[int]]
    core: EngineCore
    preemptions: int = 0
    cached_tokens: int = 0
    chunked_spans: int = 0  # prefill spans that stopped short of the prompt end
    runner: ModelRunner | None = None


def run_engine(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int | list[int], *,
               block_size: int = 4, num_blocks: int = 256, staggered: bool = False,
               waves: list[int] | None = None,
               device: str = "cpu", attention_backend: str = "torch", enforce_eager: bool = False,
               overlap: bool = False, piecewise: bool = False, speculative: str = "", drafter=None,
               **sched) -> EngineRun:
    """Greedy outputs of ``prompts`` through the real engine. ``staggered``: each prompt is added
    only after the previous one finished (so later prompts hit the prefix cache); ``waves``: sizes of
    groups of prompts, each added once the previous group finished (an idle engine between them); ``overlap``:
    steps run through the overlapping StepLoop (placeholder inputs filled on the device);
    ``piecewise``: prefill and mixed steps go through PiecewiseGraphs (a dry run off CUDA);
    ``speculative`` / ``drafter``: speculative decoding (EngineConfig.speculative, EngineCore's drafter)."""
    sched.setdefault("max_model_len", 512)
    config = EngineConfig(cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
                          scheduler=SchedulerConfig(**sched), speculative=speculative)
    runner = ModelRunner(loaded, RunnerConfig(attention_backend=attention_backend, device=device,
                                              enforce_eager=enforce_eager), config)
    if piecewise and runner.piecewise is None:
        runner.piecewise = PiecewiseGraphs(runner.model, runner.kv_caches, runner.backend,
                                           max_tokens=config.scheduler.max_num_batched_tokens,
                                           max_seqs=config.scheduler.max_num_seqs, device=runner.device)
        runner.piecewise.capture()
    core = EngineCore(config, eos_token_id=None, drafter=drafter)
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(prompts)
    outputs: dict[int, list[int]] = {}
    reqs = []
    run = EngineRun([], core, runner=runner)

    def add(i: int) -> None:
        params = SamplingParams(max_tokens=max_tokens[i], temperature=0.0, ignore_eos=True)
        rid = core.add_request(prompts[i], params, 0.0)
        reqs.append(core.requests[rid])
        outputs[rid] = []

    loop = StepLoop(core, runner, lambda: 0.0, overlap=overlap)

    def drain() -> None:
        while core.has_unfinished() or loop.busy:
            for out in loop.step():
                assert not out.plan.empty
                core.block_manager.check_invariants()
                for span in out.plan.spans:
                    req = core.requests.get(span.request_id)
                    if req is not None and not span.sample and span.num_tokens > 1:
                        run.chunked_spans += 1
                for d in out.deltas:
                    outputs[d.request_id].extend(d.new_token_ids)

    if staggered:
        waves = [1] * len(prompts)
    first = 0
    for size in waves or [len(prompts)]:
        for i in range(first, first + size):
            add(i)
        drain()
        first += size
    run.outputs = [outputs[r.request_id] for r in reqs]
    run.preemptions = sum(r.num_preemptions for r in reqs)
    run.cached_tokens = sum(r.num_cached_tokens for r in reqs)
    return run


@functools.lru_cache(maxsize=1)
def smollm2_folder() -> Path:
    """The default model's converted HF folder (the GGUF is converted once and cached)."""
    from runtime.executor.model.gguf import converted_folder
    from runtime.executor.model.loader import default_model_path, file_identity

    path = default_model_path()
    return converted_folder(path, file_identity(path))


# (sequence id, cached tokens, new tokens) per sequence, decodes first: prompts, a decode-only step
# (the CUDA-graph shape), then a mixed step with a prefix-cached chunk
FORWARD_STEPS = [[(0, 0, 5), (1, 0, 7)], [(0, 5, 1), (1, 7, 1)], [(1, 8, 1), (0, 6, 4), (2, 0, 3)]]


@torch.inference_mode()
def forward_steps(model, backend, steps=FORWARD_STEPS, block_size: int = 4, seed: int = 0) -> list[torch.Tensor]:
    """Logits of every token of each step of ``model.forward`` on fresh paged caches (sequence i owns
    blocks 8i..8i+7), random token ids: drives the model without the engine."""
    from runtime.executor.attention import AttentionMetadata

    spec, device = model.spec, model.embed_tokens.weight.device
    dtype, per_seq = model.embed_tokens.weight.dtype, 8
    num_seqs = 1 + max(s for step in steps for s, _, _ in step)
    shape = (num_seqs * per_seq, block_size, spec.num_kv_heads, spec.head_dim)
    kv_caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                 for _ in range(spec.num_layers)]
    gen = torch.Generator().manual_seed(seed)
    logits = []
    for step in steps:
        tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s, _, _ in step]
        slots = [t[p // block_size] * block_size + p % block_size for t, (_, c, n) in zip(tables, step)
                 for p in range(c, c + n)]
        positions = [p for _, c, n in step for p in range(c, c + n)]
        lens = [n for _, _, n in step]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=device),
            query_start_loc=torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([c + n for _, c, n in step], dtype=torch.int32, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            num_decodes=sum(1 for _, c, n in step if n == 1 and c > 0), max_query_len=max(lens),
            max_seq_len=max(c + n for _, c, n in step), query_lens_cpu=lens,
            seq_lens_cpu=[c + n for _, c, n in step])
        ids = torch.randint(0, spec.vocab_size, (len(positions),), generator=gen).to(device)
        logits.append(model(ids, torch.tensor(positions, device=device), kv_caches, meta, backend, None))
    return logits
