"""host_inputs / to_device and the block-table rows: q_len-1 spans move first (attention's batched
decode path), positions and slots follow the block tables, and the logits rows come back in plan order."""

from __future__ import annotations

from array import array

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.engine.request import Request
from runtime.engine.types import StepPlan
from runtime.executor.block_table_rows import BlockTableRows
from runtime.executor.model_inputs import host_inputs, to_device
from traces.events import Span
from traces.params import SamplingParams


def _req(rid: int, n: int) -> Request:
    return Request(rid, array("i", range(100 * rid, 100 * rid + n)), SamplingParams(), 0.0, 4096)


def test_reorder_positions_slots_and_logit_rows():
    bs = 4
    reqs = {0: _req(0, 10), 1: _req(1, 6), 2: _req(2, 9), 3: _req(3, 3)}
    spans = [
        Span(0, 2, 8, True),   # prefill chunk after 2 cached tokens, samples
        Span(1, 5, 1, True),   # decode
        Span(2, 0, 4, False),  # first chunk of a longer prompt, no sample
        Span(3, 2, 1, True),   # a 1-token span (prefix hit left one token) after the prefills
    ]
    tables = [[7, 3, 9], [1, 5], [2], [8]]
    plan = StepPlan(0, spans, tables, [], [], 14, sum(s.sample for s in spans))
    inp = to_device(host_inputs(plan, reqs, bs), torch.device("cpu"))
    meta = inp.meta
    assert meta.num_decodes == 2
    # order: spans 1, 3 (q_len 1), then 0, 2
    assert inp.input_ids.tolist() == [105, 302] + list(range(2, 10)) + list(range(200, 204))
    assert inp.positions.tolist() == [5, 2] + list(range(2, 10)) + [0, 1, 2, 3]
    assert meta.seq_lens_cpu == [6, 3, 10, 4]
    assert meta.query_start_loc_cpu == [0, 1, 2, 10, 14]
    slot = lambda table, p: table[p // bs] * bs + p % bs  # noqa: E731
    expected = [slot(tables[1], 5), slot(tables[3], 2)] + [slot(tables[0], p) for p in range(2, 10)] + \
               [slot(tables[2], p) for p in range(4)]
    assert meta.slot_mapping.tolist() == expected
    assert meta.block_tables.tolist() == [[1, 5, 0], [8, 0, 0], [7, 3, 9], [2, 0, 0]]
    # sampling spans in plan order: 0 (last token of its chunk = row 9), 1 (row 0), 3 (row 1)
    assert inp.logits_indices.tolist() == [9, 0, 1]
    assert [r.request_id for r in inp.sampled_requests] == [0, 1, 3]


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3), st.booleans()), min_size=1, max_size=60))
def test_block_table_rows_equal_a_fresh_flatten(ops):
    """Tables grow, get replaced (preemption), requests end; every gather equals the naive table."""
    rows = BlockTableRows(width=2, capacity=2)
    tables: dict[int, list[int]] = {}
    next_block = 0
    for rid, grow, replace in ops:
        if replace or rid not in tables:
            tables[rid] = []
        for _ in range(grow):
            tables[rid].append(next_block)
            next_block += 1
        if len(tables) > 5:  # a request ends
            tables.pop(min(tables))
        ids = sorted(tables)
        got = rows.gather(ids, [tables[i] for i in ids], tables)
        width = max(1, max(len(t) for t in tables.values()))
        want = np.zeros((len(ids), width), np.int32)
        for k, i in enumerate(ids):
            want[k, :len(tables[i])] = tables[i]
        assert got.shape == want.shape and (got == want).all()
