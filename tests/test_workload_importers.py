"""Importers: the shared trace files as published, the vendored excerpts, bad rows, our own logs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tests.sim_helpers import DATA, TRACES, VaryingDurationExecutor, record_live, small_config
from traces.events import Aborted, Arrived
from traces.formats import detect_format, load_workload
from traces.importers.azure import read_azure_csv
from traces.importers.log import read_log_workload
from traces.importers.mooncake import read_mooncake_jsonl
from traces.log import LogWriter
from traces.params import SamplingParams
from traces.prompt import PromptIds, PromptSynthetic, materialize
from traces.workload import RequestSpec, Workload, WorkloadError

# row counts from data/traces/SOURCES.md
PUBLIC_TRACES = {
    "AzureLLMInferenceTrace_code.csv": 8_819,
    "AzureLLMInferenceTrace_conv.csv": 19_366,
    "synthetic_trace.jsonl": 3_993,
}


@pytest.mark.parametrize("name,rows", list(PUBLIC_TRACES.items()))
def test_public_trace_files_import_every_row(name, rows):
    path = TRACES / name
    wl = load_workload(path)
    assert len(wl) == rows
    assert wl.requests[0].arrival == 0.0
    assert all(b.arrival >= a.arrival for a, b in zip(wl.requests, wl.requests[1:]))
    assert all(r.params.ignore_eos and r.params.max_tokens >= 1 for r in wl)
    if name.endswith(".csv"):  # SOURCES.md: code spans 3,436 s, conv 3,502 s
        assert wl.duration == pytest.approx({"AzureLLMInferenceTrace_code.csv": 3436,
                                             "AzureLLMInferenceTrace_conv.csv": 3502}[name], abs=1)
    else:  # 0 to 1,022,025 ms; 121,877 block references, 43,924 unique
        assert wl.duration == pytest.approx(1022.025)
        refs = [h for r in wl for h in r.prompt.segment_ids]
        assert len(refs) == 121_877 and len(set(refs)) == 43_924


def test_azure_excerpts():
    for name in ("azure_code_head200.csv", "azure_conv_head200.csv"):
        wl = read_azure_csv(DATA / name)
        assert len(wl) == 200 and detect_format(DATA / name) == "azure"
    wl = read_azure_csv(DATA / "azure_code_head200.csv")
    first = wl.requests[0]  # 2023-11-16 18:17:03.9799600,4808,10
    assert first.arrival == 0.0 and first.prompt.num_tokens == 4808 and first.params.max_tokens == 10
    assert wl.requests[1].arrival == pytest.approx(0.052)  # 18:17:04.0319600
    assert isinstance(first.prompt, PromptSynthetic) and not first.prompt.segment_ids
    # every prompt is unique: no accidental prefix sharing in a trace without prefix information
    a, b = (materialize(r.prompt)[:16].tolist() for r in wl.requests[:2])
    assert a != b


def test_mooncake_excerpt_equal_hash_ids_give_equal_blocks():
    wl = read_mooncake_jsonl(DATA / "mooncake_head200.jsonl")
    assert len(wl) == 200 and detect_format(DATA / "mooncake_head200.jsonl") == "mooncake"
    by_block: dict[int, list[int]] = {}
    for r in wl:
        toks = materialize(r.prompt)
        assert len(toks) == r.prompt.num_tokens
        for i, h in enumerate(r.prompt.segment_ids):
            block = toks[i * 512 : (i + 1) * 512].tolist()
            if len(block) == 512:
                by_block.setdefault(h, block)
                assert by_block[h] == block
    uses = Counter(h for r in wl for h in set(r.prompt.segment_ids))
    assert sum(n > 1 for n in uses.values()) == 285  # hash ids shared by several requests
    assert wl.requests[2].arrival == pytest.approx(0.040)


def test_mooncake_prefix_sharing_shows_up_as_prefix_cache_hits():
    from analysis.frames import frames_from_events
    from analysis.metrics import summarize
    from simulator.cost.linear_model import LinearCostModel
    from simulator.sim import simulate
    from traces.events import Admitted

    wl = read_mooncake_jsonl(DATA / "mooncake_head200.jsonl")
    # which requests start with a chain of hash ids an earlier request had (and how long it is)
    seen: set[tuple[int, ...]] = set()
    expected: dict[int, int] = {}
    for i, r in enumerate(wl):
        ids, k = r.prompt.segment_ids, 0
        while k < len(ids) and tuple(ids[: k + 1]) in seen:
            k += 1
        seen.update(tuple(ids[:j]) for j in range(1, len(ids) + 1))
        if k:
            expected[i] = k
    assert len(expected) == 10
    # one KV block per hash id, and a pool large enough never to evict
    cfg = small_config(num_blocks=8000, budget=16384, block_size=512).replace(
        **{"scheduler.max_model_len": wl.max_request_tokens()})
    events: list = []
    simulate(wl, cfg, LinearCostModel({"const": 0.01, "prefill_tokens": 1e-7}), sink=events.append)
    hits = {e.request_id: e.num_cached_tokens // 512 for e in events if isinstance(e, Admitted) and e.num_cached_tokens}
    assert set(hits) == set(expected)
    assert all(expected[i] - 1 <= hits[i] <= expected[i] for i in hits)  # a partial last block is never a hit
    assert summarize(frames_from_events(events))["prefix_hit_rate"] > 0.05


BAD_AZURE = [
    ("2023-11-16 18:17:03.98,12\n", ":3: expected 3 fields, got 2"),
    ("yesterday,12,3\n", ":3: field TIMESTAMP"),
    ("2023-11-16 18:17:04.00,abc,3\n", ":3: field ContextTokens"),
    ("2023-11-16 18:17:04.00,12,0\n", ":3: field GeneratedTokens"),
]


@pytest.mark.parametrize("row,message", BAD_AZURE)
def test_azure_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,10,2\n" + row
                    + "2023-11-16 18:17:05.00,11,3\n")
    with pytest.raises(WorkloadError) as e:
        load_workload(path)
    assert str(path) in str(e.value) and message in str(e.value)
    wl = load_workload(path, skip_bad_rows=True)
    assert len(wl) == 2 and wl.meta["skipped_rows"] == 1 and message in wl.meta["skipped_reasons"][0]


def test_azure_header_must_name_the_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time,in,out\n1,2,3\n")
    with pytest.raises(WorkloadError, match=r"t\.csv:1: header must name the columns"):
        read_azure_csv(path)


BAD_MOONCAKE = [
    ('{"timestamp": 5, "input_length": "x", "output_length": 3, "hash_ids": [1]}', "$.input_length"),
    ('{"timestamp": 5, "output_length": 3, "hash_ids": [1]}', "input_length"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": [1]}', "field output_length"),
    ('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}', "field hash_ids"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 2, "hash_ids": [1]}', "field timestamp"),
    ("not json", ":2: not a JSON object"),
]


@pytest.mark.parametrize("row,message", BAD_MOONCAKE)
def test_mooncake_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}'
    path.write_text("\n".join([good, row, good]) + "\n")
    with pytest.raises(WorkloadError) as e:
        read_mooncake_jsonl(path)
    assert f"{path}:2:" in str(e.value) and message in str(e.value)
    wl = read_mooncake_jsonl(path, skip_bad_rows=True)
    assert len(wl) == 2 and wl.meta["skipped_rows"] == 1


def test_unknown_formats_are_errors(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(WorkloadError, match="not a known workload format"):
        load_workload(path)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(WorkloadError, match="empty file"):
        load_workload(empty)
    with pytest.raises(FileNotFoundError):
        load_workload(tmp_path / "missing.csv")


def test_log_workload_takes_recorded_output_lengths_and_counts_aborts(tmp_path):
    params = SamplingParams(max_tokens=50, stop_token_ids=(3,), min_tokens=20)
    wl = Workload([RequestSpec(arrival=0.01 * i, prompt=PromptIds(list(range(i, i + 30))), params=params)
                   for i in range(6)])
    events = record_live(wl, small_config(), VaryingDurationExecutor(seed=0, eos_id=3, eos_every=9))
    # pretend request 4 was aborted by its client after it finished generating
    events.append(Aborted(time=99.0, request_id=4, reason="abort"))
    path = tmp_path / "live.jsonl"
    with LogWriter(path) as w:
        for ev in events:
            w(ev)
    got = read_log_workload(path)
    assert len(got) == 5 and got.meta["excluded"] == {"aborted": 1}
    finished = {e.request_id: e.num_output_tokens for e in events if type(e).__name__ == "Finished"}
    arrivals = {e.request_id: e.time for e in events if isinstance(e, Arrived)}
    for spec, rid in zip(got, [0, 1, 2, 3, 5]):
        assert spec.params.max_tokens == finished[rid] and spec.params.ignore_eos
        assert spec.params.stop_token_ids == () and spec.params.min_tokens <= spec.params.max_tokens
        assert spec.arrival == arrivals[rid]
    assert any(n < 50 for n in finished.values()), "some requests stopped early on eos"


def test_workload_save_load_roundtrip(tmp_path):
    wl = read_mooncake_jsonl(DATA / "mooncake_head200.jsonl", seed=7).head(50)
    path = tmp_path / "w.jsonl"
    wl.save(path)
    back = load_workload(path)
    assert back.requests == wl.requests and back.seed == 7 and back.source == wl.source
    assert back.meta["transforms"] == ["head(50)"]
    assert detect_format(path) == "log"


def test_a_gzip_log_cut_off_by_a_killed_server_is_still_a_workload(tmp_path):
    import warnings

    from traces.log import TruncatedLogWarning

    wl = Workload([RequestSpec(arrival=0.01 * i, prompt=PromptIds(list(range(i, i + 30))),
                               params=SamplingParams(max_tokens=4, ignore_eos=True), cache_salt=f"t{i % 2}")
                   for i in range(6)])
    path = tmp_path / "w.jsonl.gz"
    wl.save(path)
    data = path.read_bytes()
    for cut in (len(data) - 9, len(data) * 2 // 3):  # in the trailer; mid-stream
        cut_path = tmp_path / f"cut{cut}.jsonl.gz"
        cut_path.write_bytes(data[:cut])
        assert detect_format(cut_path) == "log"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            back = load_workload(cut_path)
        assert back.requests == wl.requests[: len(back)] and "dropped_bytes" in back.meta
        assert any(issubclass(w.category, TruncatedLogWarning) for w in caught)


def test_slicing_and_scaling():
    wl = read_azure_csv(DATA / "azure_conv_head200.csv")
    assert len(wl.head(10)) == 10
    win = wl.window(5.0, 20.0)
    assert all(0 <= r.arrival < 15 for r in win) and len(win) == sum(5 <= r.arrival < 20 for r in wl)
    fast = wl.scale_rate(2.0)
    assert fast.duration == pytest.approx(wl.duration / 2)
    longer = wl.scale_lengths(input_factor=0.5, output_factor=2.0)
    for a, b in zip(wl, longer):
        assert b.prompt.num_tokens == max(1, round(a.prompt.num_tokens * 0.5))
        assert b.params.max_tokens == a.params.max_tokens * 2
    moon = read_mooncake_jsonl(DATA / "mooncake_head200.jsonl").scale_lengths(input_factor=0.25)
    assert all(len(r.prompt.segment_ids) == -(-r.prompt.num_tokens // 512) for r in moon)
    opts = load_workload(DATA / "azure_conv_head200.csv", time_window=(0, 30), limit=5, rate_scale=3.0)
    assert len(opts) == 5 and opts.requests[-1].arrival == pytest.approx(wl.requests[4].arrival / 3)
    with pytest.raises(WorkloadError):
        wl.scale_rate(0)
    with pytest.raises(WorkloadError):
        wl.window(3, 2)
    ids = Workload([RequestSpec(arrival=0, prompt=PromptIds([1, 2]), params=SamplingParams())])
    with pytest.raises(WorkloadError, match="cannot scale a token-id prompt up"):
        ids.scale_lengths(input_factor=2)


def test_lengths_statistics_of_the_conv_excerpt():
    wl = read_azure_csv(DATA / "azure_conv_head200.csv")
    ins = np.array([r.num_prompt_tokens for r in wl])
    assert ins.min() >= 1 and wl.max_request_tokens() == max(r.num_prompt_tokens + r.num_output_tokens for r in wl)


@pytest.mark.parametrize(("name", "text", "first_line"), [
    ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,x,2\n2023-11-16 18:17:04,5,0\n", 2),
    ("bad.jsonl", '{"timestamp": 0, "input_length": 0, "output_length": 3}\n'
                  '{"timestamp": 5, "input_length": "x"}\n', 1),
], ids=["azure", "mooncake"])
def test_skip_bad_rows_with_every_row_bad_is_an_error(tmp_path, name, text, first_line):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(WorkloadError) as exc:
        load_workload(path, skip_bad_rows=True)
    assert str(exc.value).startswith(f"no valid rows in {path} (2 skipped; first: {path}:{first_line}: ")
