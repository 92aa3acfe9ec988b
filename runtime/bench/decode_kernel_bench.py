"""Decode microbenchmark: Triton paged decode vs torch gather + SDPA on the same paged KV.

Shape: Qwen3-0.6B attention (16 query heads, 8 KV heads, head_dim 128, bf16), block size 16,
shuffled block tables; context 128…8192 × batch 1…256, every sequence at the full context.
Each path is one CUDA-graph replay (as in the engine's decode step), timed with a cold L2.
Achieved GB/s = KV bytes that must be read / time, against a device-to-device copy measured in
the same run (bytes read + written).

    python -m runtime.bench.decode_kernel_bench [--json PATH]      (or: minivllm bench decode-kernel)
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial

import torch

from runtime.bench.gpu_timing import Timer, copy_bandwidth_gbs
from runtime.bench.paged_batch import make_paged_batch
from runtime.executor.kernels.paged_attention import choose_num_splits, decode_bytes, num_sms, paged_decode

CONTEXTS = (128, 512, 1024, 2048, 4096, 8192)
BATCHES = (1, 4, 16, 64, 256)


def gather_sdpa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                       max_seq_len: int) -> torch.Tensor:
    """The torch peer: gather K/V to ``[S, L, Hkv, D]`` by the block table, then SDPA with a length
    mask. GQA without copying K/V: a KV head's ``group`` query heads act as its query rows."""
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(max_seq_len, device=q.device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size  # [S, L]
    k = k_cache.flatten(0, 1)[slots].transpose(1, 2)  # [S, Hkv, L, D]
    v = v_cache.flatten(0, 1)[slots].transpose(1, 2)
    mask = (pos[None, :] < seq_lens[:, None])[:, None, None, :]
    qg = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def run(contexts=CONTEXTS, batches=BATCHES, num_heads: int = 16, num_kv_heads: int = 8, head_dim: int = 128,
        block_size: int = 16, dtype: torch.dtype = torch.bfloat16, device: str = "cuda",
        iters: int = 30, config: dict | None = None, on_row=None) -> list[dict]:
    """One row per (context, batch); ``on_row(row)`` is called as each is measured."""
    timer = Timer(device)
    copy_gbs = copy_bandwidth_gbs(device)
    sms = num_sms(device)
    scale = head_dim ** -0.5
    rows = []
    for context in contexts:
        # one pool per context, sliced for smaller batches
        full = make_paged_batch([context] * max(batches), [1] * max(batches), num_heads, num_kv_heads,
                                head_dim, block_size, dtype, device, seed=context)
        for batch in batches:
            args = (full.q[:batch], full.k_cache, full.v_cache, full.block_tables[:batch],
                    full.seq_lens[:batch], scale)
            out = torch.empty_like(args[0])
            splits = choose_num_splits(batch, num_kv_heads, context, sms)
            triton_fn = partial(paged_decode, *args, out=out, num_splits=splits, config=config)
            nosplit_fn = partial(paged_decode, *args, out=out, num_splits=1, config=config)
            sdpa_fn = partial(gather_sdpa_decode, *args, max_seq_len=context)
            err = (triton_fn().float() - sdpa_fn().float()).abs().max().item()
            t_triton = timer.graph_us(triton_fn, iters)
            t_nosplit = timer.graph_us(nosplit_fn, iters) if splits > 1 else t_triton
            try:
                t_sdpa = timer.graph_us(sdpa_fn, iters)
            except RuntimeError as e:  # e.g. out of memory: keep the Triton figures
                print(f"sdpa failed at {batch}x{context}: {e}", file=sys.stderr)
                t_sdpa = float("nan")
            nbytes = decode_bytes([context] * batch, num_kv_heads, head_dim, full.k_cache.element_size())
            rows.append({
                "context": context, "batch": batch, "splits": splits, "kv_mb": nbytes / 1e6,
                "triton_us": t_triton, "triton_nosplit_us": t_nosplit, "sdpa_us": t_sdpa,
                "triton_gbs": nbytes / t_triton / 1e3, "sdpa_gbs": nbytes / t_sdpa / 1e3,
                "triton_frac_copy": nbytes / t_triton / 1e3 / copy_gbs,
                "speedup_vs_sdpa": t_sdpa / t_triton, "max_abs_diff": err, "copy_gbs": copy_gbs,
            })
            if on_row:
                on_row(rows[-1])
        del full
        torch.cuda.empty_cache()
    return rows


def header(copy_gbs: float) -> str:
    return (f"decode kernel (16 q / 8 kv heads, head_dim 128, bf16, block 16); copy bandwidth "
            f"{copy_gbs:.0f} GB/s (read + write)\n"
            f"{'ctx':>5} {'batch':>5} {'spl':>3} {'KV MB':>8} {'triton µs':>9} {'no-split':>9} "
            f"{'sdpa µs':>9} {'triton GB/s':>11} {'%copy':>6} {'sdpa GB/s':>9} {'x sdpa':>6}")


def format_row(r: dict) -> str:
    return (f"{r['context']:>5} {r['batch']:>5} {r['splits']:>3} {r['kv_mb']:>8.1f} "
            f"{r['triton_us']:>9.1f} {r['triton_nosplit_us']:>9.1f} {r['sdpa_us']:>9.1f} "
            f"{r['triton_gbs']:>11.0f} {100 * r['triton_frac_copy']:>5.0f}% {r['sdpa_gbs']:>9.0f} "
            f"{r['speedup_vs_sdpa']:>6.1f}")


def report(rows: list[dict]) -> str:
    if not rows:
        return "no rows"
    return "\n".join([header(rows[0]["copy_gbs"])] + [format_row(r) for r in rows])


def versions() -> dict:
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    args = parser.parse_args(argv)
    printed: list[dict] = []

    def show(row: dict) -> None:  # rows as they come: a run cut short still reports
        if not printed:
            print(header(row["copy_gbs"]))
        printed.append(row)
        print(format_row(row), flush=True)

    rows = run(args.contexts, args.batches, on_row=show)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "decode-kernel", **versions(), "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
