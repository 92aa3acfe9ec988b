"""Sweeps on the GPU: decode tile configs, decode split counts, prefill tiles vs gather + SDPA,
prefill split counts.

They picked the defaults in ``_decode_config``, ``choose_num_splits`` and ``_prefill_config``, and
check ``prefill_splits`` (the decode rule applied to prefill programs);
results in docs/kernels-notes.md. ``python -m runtime.bench.kernel_tune [--sections ...] [--json P]``.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch

from runtime.bench.gpu_timing import Timer, copy_bandwidth_gbs
from runtime.bench.paged_batch import PagedBatch, make_paged_batch
from runtime.executor.kernels.paged_attention import choose_num_splits, decode_bytes, num_sms, paged_decode
from runtime.executor.kernels.prefill import paged_prefill_sdpa, prefill_launch, prefill_splits

DECODE_CONFIGS = [(32, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 8, 2),
                  (16, 4, 4)]  # (BLOCK_N, num_warps, num_stages)
# (name, q heads, kv heads, head_dim, batch, context)
DECODE_SHAPES = [("qwen3", 16, 8, 128, 256, 4096), ("qwen3", 16, 8, 128, 64, 2048),
                 ("qwen3", 16, 8, 128, 4, 8192), ("qwen3", 16, 8, 128, 1, 8192),
                 ("smollm2", 9, 3, 64, 256, 2048)]
PREFILL_CONFIGS = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 2),
                   (64, 32, 4, 3)]  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
# (name, [(cached, new)] per sequence)
PREFILL_SHAPES = [("8 x 512 fresh", [(0, 512)] * 8), ("4 x 512 after 3584", [(3584, 512)] * 4),
                  ("1 x 4096 fresh", [(0, 4096)]), ("64 x 128 fresh", [(0, 128)] * 64)]

# short chunks over long cached prefixes (few programs: split), and full chunks (many: not)
PREFILL_SPLIT_SHAPES = [("1 x 256 after 40k", [(40704, 256)]), ("1 x 64 after 16k", [(16320, 64)]),
                        ("4 x 128 after 8k", [(8064, 128)] * 4), ("1 x 2048 after 32k", [(30720, 2048)]),
                        ("8 x 512 after 3584", [(3584, 512)] * 8)]
PREFILL_SPLIT_COUNTS = [1, 2, 4, 8, 16]


def tune_decode(timer: Timer, copy_gbs: float, block_size: int = 16) -> list[dict]:
    rows = []
    for name, heads, kv_heads, head_dim, batch, context in DECODE_SHAPES:
        b = make_paged_batch([context] * batch, [1] * batch, heads, kv_heads, head_dim, block_size,
                             torch.bfloat16, "cuda", seed=batch)
        splits = choose_num_splits(batch, kv_heads, context, num_sms("cuda"))
        nbytes = decode_bytes(b.seq_lens_cpu, kv_heads, head_dim, 2)
        out = torch.empty_like(b.q)
        for block_n, warps, stages in DECODE_CONFIGS:
            cfg = {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
            us = timer.graph_us(partial(paged_decode, b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens,
                                        head_dim ** -0.5, out=out, num_splits=splits, config=cfg))
            rows.append({"shape": f"{name} {batch}x{context}", "splits": splits, "config": cfg, "us": us,
                         "frac_copy": nbytes / us / 1e3 / copy_gbs})
    return rows


SPLIT_SHAPES = [(1, 2048), (1, 8192), (4, 2048), (4, 8192), (16, 2048), (16, 8192), (32, 4096)]
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def sweep_splits(timer: Timer, copy_gbs: float, block_size: int = 16) -> list[dict]:
    """Qwen3 shapes with few sequences: time every split count, mark the heuristic's choice."""
    rows = []
    heads, kv_heads, head_dim = 16, 8, 128
    for batch, context in SPLIT_SHAPES:
        b = make_paged_batch([context] * batch, [1] * batch, heads, kv_heads, head_dim, block_size,
                             torch.bfloat16, "cuda", seed=batch)
        chosen = choose_num_splits(batch, kv_heads, context, num_sms("cuda"))
        nbytes = decode_bytes(b.seq_lens_cpu, kv_heads, head_dim, 2)
        out = torch.empty_like(b.q)
        for n in SPLIT_COUNTS:
            us = timer.graph_us(partial(paged_decode, b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens,
                                        head_dim ** -0.5, out=out, num_splits=n))
            rows.append({"shape": f"{batch}x{context}", "splits": n, "chosen": n == chosen, "us": us,
                         "frac_copy": nbytes / us / 1e3 / copy_gbs})
    return rows


def _prefill_flops(seqs: list[tuple[int, int]], num_heads: int, head_dim: int) -> float:
    # QK^T and PV: 4 * D flops per visible (query, key) pair per head
    pairs = sum(n * c + n * (n + 1) / 2 for c, n in seqs)
    return 4 * head_dim * num_heads * pairs


def _prefill_us(timer: Timer, b: PagedBatch, new: list[int], out: torch.Tensor, config: dict | None = None,
                splits: int | None = None) -> float:
    """One CUDA-graph replay of the Triton prefill over the whole batch (the launch prepared outside)."""
    launch = prefill_launch(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, out, 0,
                            len(new), max(new), (0, sum(new)), max(b.seq_lens_cpu), config, splits)
    return timer.graph_us(partial(launch, b.k_cache, b.v_cache, b.q.shape[-1] ** -0.5))


def _prefill_batches(shapes: list[tuple[str, list[tuple[int, int]]]], block_size: int, heads: int = 16,
                     kv_heads: int = 8, head_dim: int = 128):
    """Per shape (Qwen3's heads by default): its name, a random paged batch, its new-token counts, an
    output buffer and its attention FLOPs."""
    for name, seqs in shapes:
        new = [n for _, n in seqs]
        b = make_paged_batch([c + n for c, n in seqs], new, heads, kv_heads, head_dim, block_size, torch.bfloat16,
                             "cuda")
        yield name, b, new, torch.empty_like(b.q), _prefill_flops(seqs, heads, head_dim)


def tune_prefill(timer: Timer, block_size: int = 16) -> list[dict]:
    rows = []
    for name, b, new, out, flops in _prefill_batches(PREFILL_SHAPES, block_size):
        args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, b.q.shape[-1] ** -0.5)
        sdpa_us = timer.eager_us(partial(paged_prefill_sdpa, *args, out, first_seq=0, num_seqs=len(new)))
        rows.append({"shape": name, "path": "gather+sdpa", "us": sdpa_us, "tflops": flops / sdpa_us / 1e6})
        for bm, bn, warps, stages in PREFILL_CONFIGS:
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
            us = _prefill_us(timer, b, new, out, cfg)
            rows.append({"shape": name, "path": "triton", "config": cfg, "us": us,
                         "tflops": flops / us / 1e6})
    return rows


def sweep_prefill_splits(timer: Timer, block_size: int = 16) -> list[dict]:
    rows = []
    for name, b, new, out, flops in _prefill_batches(PREFILL_SPLIT_SHAPES, block_size):
        chosen = prefill_splits(len(new), max(new), b.q.shape[1], max(b.seq_lens_cpu), num_sms("cuda"))
        for n in sorted({*PREFILL_SPLIT_COUNTS, chosen}):
            us = _prefill_us(timer, b, new, out, splits=n)
            rows.append({"shape": name, "splits": n, "chosen": n == chosen, "us": us, "tflops": flops / us / 1e6})
    return rows


def _split_table(title: str, rows: list[dict], width: int, last) -> str:
    """One line per (shape, split count); * marks the count the heuristic picks."""
    return "\n".join([title] + [f"  {r['shape']:<{width}} {r['splits']:>3}{'*' if r['chosen'] else ' '}"
                                 f" {r['us']:>9.1f}  {last(r)}" for r in rows])


def report_prefill_splits(rows: list[dict]) -> str:
    return _split_table("prefill split sweep (qwen3 shapes, bf16, block 16): shape, splits, µs, TFLOP/s "
                        "(* = heuristic)", rows, 20, lambda r: f"{r['tflops']:>6.1f}")


def report_splits(rows: list[dict]) -> str:
    return _split_table("split sweep (qwen3 shapes, bf16, block 16): shape, splits, µs, fraction of copy "
                        "(* = heuristic)", rows, 10, lambda r: f"{100 * r['frac_copy']:>4.0f}%")


def report(decode_rows: list[dict], prefill_rows: list[dict]) -> str:
    lines = ["decode sweep (bf16, block 16): shape, splits, BLOCK_N/warps/stages, µs, fraction of copy"]
    for r in decode_rows:
        c = r["config"]
        lines.append(f"  {r['shape']:<18} {r['splits']:>3}  {c['BLOCK_N']:>3}/{c['num_warps']}/{c['num_stages']}"
                     f"  {r['us']:>8.1f}  {100 * r['frac_copy']:>4.0f}%")
    lines.append("prefill (qwen3 shapes, bf16, block 16): shape, path, BLOCK_M/N/warps/stages, µs, TFLOP/s")
    for r in prefill_rows:
        c = r.get("config")
        cfg = f"{c['BLOCK_M']}/{c['BLOCK_N']}/{c['num_warps']}/{c['num_stages']}" if c else "-"
        lines.append(f"  {r['shape']:<20} {r['path']:<11} {cfg:>12}  {r['us']:>9.1f}  {r['tflops']:>6.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["configs", "prefill", "splits", "prefill-splits"],
                        choices=["configs", "prefill", "splits", "prefill-splits"])
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    timer = Timer("cuda")
    copy_gbs = copy_bandwidth_gbs("cuda")
    print(f"copy bandwidth {copy_gbs:.0f} GB/s")
    doc: dict = {"copy_gbs": copy_gbs}
    if "configs" in args.sections or "prefill" in args.sections:
        doc["decode"] = tune_decode(timer, copy_gbs) if "configs" in args.sections else []
        doc["prefill"] = tune_prefill(timer) if "prefill" in args.sections else []
        print(report(doc["decode"], doc["prefill"]))
    if "splits" in args.sections:
        doc["splits"] = sweep_splits(timer, copy_gbs)
        print(report_splits(doc["splits"]))
    if "prefill-splits" in args.sections:
        doc["prefill_splits"] = sweep_prefill_splits(timer)
        print(report_prefill_splits(doc["prefill_splits"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
