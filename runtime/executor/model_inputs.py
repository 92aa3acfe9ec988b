"""Step inputs from a StepPlan: token ids, positions, slot mapping and attention metadata.

Built with numpy in a handful of vectorised ops (the per-span Python work is one slice of the
request's token array), then sent to the device with one copy per tensor.

Order: attention wants every q_len == 1 span first (its batched decode path), so spans are
reordered stably; ``logits_indices`` are listed in *plan* order of the sampling spans, so the
sampled rows come back in the order the core expects without any remapping.

A speculating span (``plan.drafts``: its request's last token and D drafts) reads the drafts as its
input after the last token and has D + 1 logits rows, one per position, in position order
(runtime/executor/speculative.py); ``rows_per_sample`` says how many rows each sampling span has.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from runtime.engine.request import Request
from runtime.engine.types import StepPlan
from runtime.executor.attention import AttentionMetadata
from runtime.executor.block_table_rows import BlockTableRows
from runtime.executor.staging import stage


@dataclass
class HostInputs:
    """The step's inputs as host arrays (batch order: decodes first)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start: np.ndarray  # [S + 1] int64
    seq_lens: np.ndarray  # [S] int32
    block_table: np.ndarray  # [S, max_blocks] int32
    logits_indices: np.ndarray  # [rows] int64, plan order: one per sampling span (1 + D if it speculates)
    num_decodes: int
    sampled_requests: list[Request]  # plan order, one per sampling span
    # decode rows whose input token is a placeholder, and the rows of the previous launch's sampled
    # ids that hold those tokens on the device (runtime/engine/step_loop.py); empty when none
    fill_rows: np.ndarray  # [P] int64
    fill_from: np.ndarray  # [P] int64
    # per sampling span, its logits rows (1 + its drafts); None when no span speculates (one each)
    rows_per_sample: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def decode_only(self) -> bool:
        """Every span is one token (and therefore samples): the CUDA-graph case."""
        return self.num_decodes == len(self.seq_lens) == len(self.logits_indices)


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [rows] int64, plan order (as HostInputs')
    sampled_requests: list[Request]  # plan order, one per sampling span
    num_tokens: int


_NONE = np.zeros(0, np.int64)


def host_inputs(plan: StepPlan, requests: Mapping[int, Request], block_size: int,
                previous_rows: Mapping[int, int] | None = None,
                table_rows: BlockTableRows | None = None) -> HostInputs:
    """``previous_rows``: request id -> row of the previous launch's sampled ids, for the decode
    rows whose input token is still a placeholder (a negative id). ``table_rows``: the runner's
    persistent block-table rows (faster than flattening every table each step)."""
    spans = plan.spans
    n = len(spans)
    tables = plan.block_tables
    q_list = [s.num_tokens for s in spans]
    num_decodes = q_list.count(1)
    if num_decodes == n:  # all decodes (the common step): plan order is batch order
        order, reordered, ordered = range(n), False, spans
    else:
        order = [i for i in range(n) if q_list[i] == 1] + [i for i in range(n) if q_list[i] != 1]
        reordered = any(k != i for k, i in enumerate(order))
        ordered = [spans[i] for i in order]
    starts = np.fromiter((s.start for s in ordered), np.int64, n)
    q_lens = np.ones(n, np.int64) if num_decodes == n else np.array(q_list, np.int64)[order]
    if num_decodes == n:  # all decodes: one token each, no slicing
        ids = array("i", [requests[s.request_id].token_ids[s.start] for s in ordered])
    else:
        ids = array("i")
        drafts = plan.drafts
        for s in ordered:
            tokens = requests[s.request_id].token_ids
            if s.num_tokens == 1:
                ids.append(tokens[s.start])
            elif drafts is not None and s.request_id in drafts:  # its last token, then its drafts
                ids.append(tokens[s.start])
                ids.extend(drafts[s.request_id])
            else:
                ids.extend(tokens[s.start : s.start + s.num_tokens])

    ordered_tables = tables if not reordered else [tables[i] for i in order]
    if table_rows is not None:
        block_table = table_rows.gather([s.request_id for s in ordered], ordered_tables, requests)
    else:  # rows padded with 0: one flat fill through a mask instead of a loop over rows
        table_lens = np.fromiter(map(len, ordered_tables), np.int64, n)
        max_blocks = int(table_lens.max())
        block_table = np.zeros((n, max_blocks), dtype=np.int32)
        block_table[np.arange(max_blocks) < table_lens[:, None]] = np.fromiter(
            itertools.chain.from_iterable(ordered_tables), np.int32, int(table_lens.sum()))

    total = int(q_lens.sum())
    query_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(q_lens, out=query_start[1:])
    seq_of_token = np.repeat(np.arange(n), q_lens)
    positions = np.arange(total, dtype=np.int64) - query_start[:-1][seq_of_token] + starts[seq_of_token]
    slots = block_table[seq_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
    seq_lens = (starts + q_lens).astype(np.int32)

    sample_plan_idx = [i for i, s in enumerate(spans) if s.sample]
    if reordered:
        where = {i: k for k, i in enumerate(order)}
        sample_rows = np.array([where[i] for i in sample_plan_idx], dtype=np.int64)
    else:
        sample_rows = np.array(sample_plan_idx, dtype=np.int64)
    logits_indices = query_start[1:][sample_rows] - 1 if len(sample_rows) else np.zeros(0, np.int64)
    rows_per_sample = None
    if plan.drafts is not None:  # a speculating span's rows: its last D + 1 positions
        rows_per_sample = [1 + len(plan.drafts.get(spans[i].request_id, ())) for i in sample_plan_idx]
        counts = np.array(rows_per_sample, dtype=np.int64)
        firsts = np.cumsum(counts) - counts
        offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(firsts, counts)
        logits_indices = np.repeat(logits_indices - counts + 1, counts) + offsets

    input_ids = np.frombuffer(ids, dtype=np.int32).astype(np.int64)
    fill_rows = fill_from = _NONE
    if input_ids.min(initial=0) < 0:
        fill_rows = np.flatnonzero(input_ids < 0)
        if fill_rows[-1] >= num_decodes:
            raise RuntimeError("a prefill input is a placeholder (it is only ever a decode's input)")
        try:
            fill_from = np.array([previous_rows[ordered[i].request_id] for i in fill_rows.tolist()], np.int64)
        except (KeyError, TypeError):
            raise RuntimeError("a decode input is a placeholder the previous launch did not sample") from None
    return HostInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        query_start=query_start,
        seq_lens=seq_lens,
        block_table=block_table,
        logits_indices=logits_indices.astype(np.int64, copy=False),
        num_decodes=num_decodes,
        sampled_requests=[requests[spans[i].request_id] for i in sample_plan_idx],
        fill_rows=fill_rows,
        fill_from=fill_from,
        rows_per_sample=rows_per_sample,
    )


def as_decode_rows(host: HostInputs) -> HostInputs | None:
    """``host`` as a decode-only step of one row per token, when every token is a logits row (decodes
    and speculating spans, no prefill chunk); else None. Row i attends to the keys up to its own
    position through its span's block table: a verify span's drafts are stored before the layer's
    attention, so each of its rows sees the drafts before it and none after, as the span's causal
    attention does. Such a step then replays a decode CUDA graph (runtime/executor/cuda_graphs.py)
    instead of launching a varlen attention per layer. Its ``logits_indices`` stay in plan order (a
    permutation of the rows when decodes were moved before the spans)."""
    if host.decode_only:
        return host
    n = host.num_tokens
    if len(host.logits_indices) != n:
        return None
    per_span = np.diff(host.query_start)
    return HostInputs(
        input_ids=host.input_ids,
        positions=host.positions,
        slot_mapping=host.slot_mapping,
        query_start=np.arange(n + 1, dtype=np.int64),
        seq_lens=(host.positions + 1).astype(np.int32),
        block_table=np.repeat(host.block_table, per_span, axis=0),
        logits_indices=host.logits_indices,
        num_decodes=n,
        sampled_requests=host.sampled_requests,
        fill_rows=host.fill_rows,  # placeholders are decode inputs: the first rows, one token each
        fill_from=host.fill_from,
        rows_per_sample=host.rows_per_sample,
    )


def fill_placeholders(input_ids: torch.Tensor, rows: torch.Tensor, source_rows: torch.Tensor,
                      previous_ids: torch.Tensor | None) -> None:
    """Write the previous launch's sampled ids into the placeholder rows, on the device."""
    if rows.numel():
        input_ids.index_copy_(0, rows, previous_ids.index_select(0, source_rows))


def to_device(host: HostInputs, device: torch.device, previous_ids: torch.Tensor | None = None) -> StepInputs:
    """Device tensors of ``host``: on CUDA one packed non-blocking copy (runtime/executor/staging.py).
    ``previous_ids``: the previous launch's sampled ids (device), when ``host`` has placeholders."""
    arrays = {"input_ids": host.input_ids, "positions": host.positions, "slot_mapping": host.slot_mapping,
              "query_start": host.query_start.astype(np.int32), "seq_lens": host.seq_lens,
              "block_table": host.block_table, "logits_indices": host.logits_indices,
              "fill_rows": host.fill_rows, "fill_from": host.fill_from}
    if device.type == "cpu":
        t = {k: torch.from_numpy(v) for k, v in arrays.items()}
        # the placeholders are filled on the tensor: keep the host array as the GPU path sees it
        # (a CUDA-graph path that restages host.input_ids must find its placeholders there)
        t["input_ids"] = t["input_ids"].clone()
    else:
        t, _ = stage(arrays, device)
        t["block_table"] = t["block_table"].view(host.block_table.shape)
    fill_placeholders(t["input_ids"], t["fill_rows"], t["fill_from"], previous_ids)
    seq_lens_list = host.seq_lens.tolist()
    q_lens_list = np.diff(host.query_start).tolist()
    meta = AttentionMetadata(
        slot_mapping=t["slot_mapping"],
        query_start_loc=t["query_start"],
        seq_lens=t["seq_lens"],
        block_tables=t["block_table"],
        num_decodes=host.num_decodes,
        max_query_len=max(q_lens_list),
        max_seq_len=max(seq_lens_list),
        query_lens_cpu=q_lens_list,
        seq_lens_cpu=seq_lens_list,
        query_start_loc_cpu=host.query_start.tolist(),
    )
    return StepInputs(
        input_ids=t["input_ids"],
        positions=t["positions"],
        meta=meta,
        logits_indices=t["logits_indices"],
        sampled_requests=host.sampled_requests,
        num_tokens=host.num_tokens,
    )
