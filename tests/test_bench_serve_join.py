"""bench serve's client records paired with the server's log request by request (by the prompt
sent), the gaps taken per request, and the bottleneck named from both sides' measured lags."""

from __future__ import annotations

import pytest

from analysis.frames import load_frames
from analysis.metrics import latencies
from runtime.bench import serve_client
from runtime.bench.serve_gap import compare
from runtime.bench.serve_join import NoPromptIds, join, prompt_key
from runtime.bench.serve_verdict import verdict
from simulator.cost.model_base import CostModel
from simulator.sim import simulate
from tests.sim_helpers import small_config
from traces.log import LogWriter
from traces.params import SamplingParams
from traces.prompt import PromptIds, PromptSynthetic
from traces.workload import RequestSpec, Workload


class FlatCost(CostModel):
    def step_time(self, step, spans, verifying=()):
        return 0.01 + 1e-4 * sum(s.num_tokens for s in spans)


def _workload(prompts: list[list[int]]) -> Workload:
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    return Workload([RequestSpec(arrival=0.02 * i, prompt=PromptIds(p), params=sp) for i, p in enumerate(prompts)])


def _served(tmp_path, wl: Workload):
    path = tmp_path / "server.jsonl"
    with LogWriter(path) as log:
        simulate(wl, small_config(), FlatCost(), sink=log)
    return path


def _answered(record, lat, rid: int, extra: float) -> None:
    """The client saw engine request ``rid`` ``extra`` seconds later at each end (its trip)."""
    row = lat.set_index("request_id").loc[rid]
    record.ttft, record.e2e, record.output_tokens = row["ttft"] + extra, row["e2e"] + extra, 4
    record.itl = [0.01, 0.01, 0.01]


def test_join_pairs_equal_prompts_in_time_order():
    a, b = prompt_key([1, 2, 3]), prompt_key([4, 5])
    client = [(0, 0.0, a), (1, 0.1, a), (2, 0.2, b), (3, 0.3, prompt_key([9]))]
    engine = [(7, 5.15, a), (5, 5.05, a), (6, 5.20, b), (8, 5.3, prompt_key([6]))]
    assert join(client, engine) == {0: 5, 1: 7, 2: 6}
    assert prompt_key("1 2 3") != prompt_key([1, 2, 3])


def test_each_client_request_is_compared_with_its_own_engine_request(tmp_path):
    """Six requests reached the engine (two with one prompt, one sent by another client); the client
    has a 429 never served and a time-out. Gaps are per request: exactly the trip the client added."""
    prompts = [[10 + i] * (8 + i) for i in range(5)] + [[10] * 8]  # the last repeats the first
    wl = _workload(prompts)
    log = _served(tmp_path, wl)
    lat = latencies(load_frames(log).requests)
    mine = Workload([*wl.requests[:5], wl.requests[5]])
    _, records = serve_client.prepare(mine, "m")
    for i, r in enumerate(records):
        r.sent = 0.02 * i
    records[4].error = "http 429"  # refused at the door: the engine's request 4 was another client's
    records[3].error = "timeout"   # reached the engine, no answer on the client's side
    for i in (0, 1, 2, 5):
        _answered(records[i], lat, i, extra=0.002)
    gap = compare(records, log)
    assert (gap["compared"], gap["paired"], gap["client_requests"], gap["engine_requests"]) == (4, 5, 5, 6)
    for key in ("ttft", "e2e"):
        for p in ("p50", "p90", "p99"):
            assert gap["metrics"][key][p]["gap"] == pytest.approx(2.0)
    assert gap["metrics"]["itl"]["p50"]["client"] == pytest.approx(10.0)
    assert gap["engine_queue_ms"]["p50"] is not None and gap["engine_queue_ms"]["p50"] >= 0


def test_one_answered_request_is_not_set_against_the_whole_log(tmp_path):
    wl = _workload([[20 + i] * (30 + 10 * i) for i in range(6)])
    log = _served(tmp_path, wl)
    lat = latencies(load_frames(log).requests)
    _, records = serve_client.prepare(wl, "m")
    for r in records[1:]:
        r.error = "timeout"
    _answered(records[0], lat, 0, extra=0.001)
    gap = compare(records, log)
    assert gap["compared"] == 1
    assert gap["metrics"]["ttft"]["p50"]["gap"] == pytest.approx(1.0)
    assert gap["metrics"]["ttft"]["p99"]["engine"] == pytest.approx(lat["ttft"].iloc[0] * 1e3)


def test_text_prompts_pair_by_the_text_the_engine_ids_decode_to(tmp_path):
    wl = _workload([[1, 2, 3], [4, 5, 6, 7]])
    log = _served(tmp_path, wl)

    def decode(ids):  # the text the client sent for these ids
        return " ".join(map(str, ids))

    _, records = serve_client.prepare(wl, "m", decode=decode)
    lat = latencies(load_frames(log).requests)
    for i, r in enumerate(records):
        _answered(r, lat, i, extra=0.003)
    gap = compare(records, log, decode)
    assert gap["compared"] == 2 and gap["metrics"]["ttft"]["p50"]["gap"] == pytest.approx(3.0)


def test_a_log_without_prompt_ids_cannot_be_paired(tmp_path):
    sp = SamplingParams(max_tokens=2, ignore_eos=True)
    wl = Workload([RequestSpec(arrival=0.0, prompt=PromptSynthetic(num_tokens=20, unique_seed=1), params=sp)])
    log = _served(tmp_path, wl)
    _, records = serve_client.prepare(wl, "m")
    with pytest.raises(NoPromptIds, match="ids"):
        compare(records, log)


@pytest.mark.parametrize(("lag", "queue", "expected"), [
    (4000.0, 90000.0, "bottleneck: the server"),
    (900.0, 10.0, "bottleneck: the client"),
    (5.0, 20.0, "bottleneck: neither"),
    (900.0, None, "engine's queueing is unknown"),
])
def test_the_bottleneck_is_the_side_that_fell_further_behind(lag, queue, expected):
    assert expected in verdict(lag, queue)


def test_no_line_when_the_client_kept_its_schedule_and_the_engine_is_unknown():
    assert verdict(3.0, None) is None and verdict(None, None) is None
