"""The paged KV pool: per layer a K and a V tensor ``[num_blocks, block_size, kv_heads, head_dim]``,
sized from a memory budget (or a fixed block count).

Budget (``plan_num_blocks``): ``kv_cache_gb`` if set; else on CUDA a fraction of the device's
memory (what other processes and the weights already hold is subtracted, and a reserve for
activations is kept back), on the CPU ``DEFAULT_CPU_KV_GB``. The engine's ``cache.num_blocks`` is
what this budget holds, unless the user fixed it. A CPU pool larger than the memory the machine has
free is refused before it is allocated (else the kernel's out-of-memory killer ends the process,
with no word of why).
"""

from __future__ import annotations

import torch

from runtime.engine.config import ConfigError, SchedulerConfig
from runtime.executor.config import DEFAULT_CPU_KV_GB, RunnerConfig
from runtime.executor.model.spec import ModelSpec


def block_bytes(spec: ModelSpec, dtype: torch.dtype, block_size: int) -> int:
    return spec.kv_bytes_per_token(dtype.itemsize) * block_size


def activation_reserve(spec: ModelSpec, dtype: torch.dtype, max_tokens: int, max_seqs: int) -> int:
    """Generous bound on one step's transient memory (hidden states, fused projections, logits and
    sampler temporaries), doubled for allocator slack."""
    per_token = 3 * spec.hidden_size + spec.q_size + 2 * spec.kv_size + 4 * spec.intermediate_size
    logits = max_seqs * spec.vocab_size * 4 * 4
    return 2 * (max_tokens * per_token * dtype.itemsize + logits) + (256 << 20)


def plan_num_blocks(spec: ModelSpec, dtype: torch.dtype, device: torch.device, block_size: int,
                    runner: RunnerConfig, scheduler: SchedulerConfig, *, logits_rows: int | None = None,
                    extra_block_bytes: int = 0, reserve_bytes: int = 0) -> int:
    """How many blocks the runner's KV budget holds. ``logits_rows``: the most logits rows a step
    samples (default max_num_seqs; speculative decoding samples 1 + K per decode); a draft model's
    pool beside it (runtime/executor/draft_model.py) takes ``extra_block_bytes`` per block and
    ``reserve_bytes`` more out of the same budget."""
    per_block = block_bytes(spec, dtype, block_size) + extra_block_bytes
    if runner.kv_cache_gb is not None:
        budget = int(runner.kv_cache_gb * (1 << 30))
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        rows = max(scheduler.max_num_seqs, logits_rows or 0)
        budget = int(free - total * (1 - runner.gpu_memory_utilization)
                     - activation_reserve(spec, dtype, scheduler.max_num_batched_tokens, rows))
    else:
        budget = int(DEFAULT_CPU_KV_GB * (1 << 30))
    budget -= reserve_bytes
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(f"the KV budget ({budget / 2**30:.2f} GiB) holds no block of {per_block} bytes; "
                         "raise kv_cache_gb or gpu_memory_utilization")
    return int(blocks)


def shared_gpu_kv_gb(device, engines: int, utilization: float) -> float:
    """GiB of KV pool for one of ``engines`` engines started one after another on one GPU: a share of
    the whole GPU (a later one would see the earlier ones' pools as used), a fifth of it left for the
    weights, graphs and activations (``serve --data-parallel-size``, ``profile --co-located``)."""
    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    return total * utilization / engines * 0.8


def available_memory() -> int | None:
    """Bytes of memory the machine has free for a new allocation (Linux's MemAvailable); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def allocate_kv(spec: ModelSpec, num_blocks: int, block_size: int, dtype: torch.dtype,
                device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if device.type == "cpu":
        need, free = num_blocks * block_bytes(spec, dtype, block_size), available_memory()
        if free is not None and need > free:
            raise ConfigError(f"num_blocks {num_blocks:,}: a KV pool of {need / 2**30:.1f} GiB, and this machine has "
                              f"{free / 2**30:.1f} GiB free; give fewer blocks or a smaller --kv-cache-gb")
    shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    # zeros, not empty: padded block-table entries point at block 0 and must never hold NaN
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(spec.num_layers)]
