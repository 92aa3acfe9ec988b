"""HF transformers peers for ``minivllm bench throughput``, on the same prompts and output lengths.

- ``single``: ``generate`` one prompt at a time.
- ``static``: ``generate`` on left-padded batches in prompt order; each batch runs to its longest
  requested output, and only the requested tokens count (what a user of HF would get).
- ``cb``: continuous batching (``init_continuous_batching`` manager, what ``generate_batch`` wraps),
  with each request's own ``max_new_tokens``.

Greedy decoding, eos ignored (``min_new_tokens`` = ``max_new_tokens``; eos -1 for cb), so every
peer produces exactly the requested number of tokens.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch


@dataclass
class PeerResult:
    name: str
    seconds: float
    output_tokens: int  # requested tokens only
    input_tokens: int
    note: str = ""
    cpu_seconds: float = 0.0  # process CPU time (all threads): a check on a shared machine
    load_avg: float = 0.0  # 1-minute load average at the end

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0


def load_hf_model(loaded, device: torch.device, dtype: torch.dtype):
    """The HF model for a loaded engine model: its HF folder, or the same shape at random."""
    import transformers

    if loaded.hf_folder is not None:
        return transformers.AutoModelForCausalLM.from_pretrained(loaded.hf_folder, dtype=dtype).to(device).eval()
    cfg_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "qwen3": transformers.Qwen3Config}[loaded.spec.model_type]
    config = cfg_cls(**{k: v for k, v in loaded.hf_config.items() if k not in ("model_type", "architectures")})
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def timed(fn):
    """Fill a PeerResult's CPU time and load average around ``fn``."""
    def wrapper(*args, **kwargs) -> PeerResult:
        c0 = time.process_time()
        result = fn(*args, **kwargs)
        result.cpu_seconds = time.process_time() - c0
        result.load_avg = os.getloadavg()[0]
        return result
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _generate(model, ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=0, eos_token_id=None)


def warmup(model, device: torch.device) -> None:
    ids = torch.ones((2, 8), dtype=torch.long, device=device)
    _generate(model, ids, torch.ones_like(ids), 4)
    _sync(device)


@timed
def run_single(model, prompts: list[list[int]], outputs: list[int], device: torch.device,
               progress: bool = True) -> PeerResult:
    from tqdm import tqdm

    t0 = time.perf_counter()
    for prompt, n in tqdm(list(zip(prompts, outputs)), desc="hf generate (1 at a time)", unit="req",
                          disable=not progress):
        ids = torch.tensor([prompt], device=device)
        out = _generate(model, ids, torch.ones_like(ids), n)
        assert out.shape[1] == len(prompt) + n
    _sync(device)
    return PeerResult("hf generate, one at a time", time.perf_counter() - t0, sum(outputs),
                      sum(map(len, prompts)))


@timed
def run_static(model, prompts: list[list[int]], outputs: list[int], device: torch.device, batch_size: int,
               progress: bool = True) -> PeerResult:
    from tqdm import tqdm

    batches = [range(i, min(i + batch_size, len(prompts))) for i in range(0, len(prompts), batch_size)]
    generated = 0
    t0 = time.perf_counter()
    for rows in tqdm(batches, desc=f"hf generate (static batches of {batch_size})", unit="batch",
                     disable=not progress):
        width = max(len(prompts[i]) for i in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):  # left padding, as decoder-only generation wants
            ids[r, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, width - len(prompts[i]):] = 1
        n = max(outputs[i] for i in rows)
        out = _generate(model, ids.to(device), mask.to(device), n)
        generated += out.shape[0] * (out.shape[1] - width)
    _sync(device)
    return PeerResult(f"hf generate, static batches of {batch_size}", time.perf_counter() - t0, sum(outputs),
                      sum(map(len, prompts)), note=f"{generated} tokens computed, {sum(outputs)} requested")


def continuous_batching_available(model) -> bool:
    return hasattr(model, "init_continuous_batching")


@timed
def run_continuous(  # no inference_mode here: HF's generation thread updates tensors made in this one
model, prompts: list[list[int]], outputs: list[int], device: torch.device,
                   progress: bool = True) -> PeerResult:
    from tqdm import tqdm
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max(outputs), do_sample=False, eos_token_id=-1, pad_token_id=0)
    bar = tqdm(total=len(prompts), desc="hf continuous batching", unit="req", disable=not progress)
    done: dict[str, int] = {}
    with model.continuous_batching_context_manager(generation_config=config, warmup=device.type == "cuda") as mgr:
        t0 = time.perf_counter()
        for prompt, n in zip(prompts, outputs):
            mgr.add_request(prompt, max_new_tokens=n, eos_token_id=-1)
        while len(done) < len(prompts):
            result = mgr.get_result(timeout=1)
            if result is not None and result.is_finished():
                if result.error:
                    raise RuntimeError(f"HF continuous batching failed: {result.error}")
                done[result.request_id] = len(result.generated_tokens)
                bar.update(1)
            elif result is None and not mgr.is_running():
                raise RuntimeError("HF continuous batching stopped before finishing")
        _sync(device)
        seconds = time.perf_counter() - t0
    bar.close()
    return PeerResult("hf continuous batching (generate_batch)", seconds, sum(outputs), sum(map(len, prompts)),
                      note=f"{sum(done.values())} tokens generated")
