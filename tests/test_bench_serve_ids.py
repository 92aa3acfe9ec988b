"""bench serve pairs its records with the server's log by the response id when the server gives one
that names a logged request (ours), and by the prompt's digest otherwise (another server's ids)."""

from __future__ import annotations

import pytest

from runtime.bench import serve_client
from runtime.bench.serve_gap import compare
from runtime.bench.serve_join import join_names
from tests.test_server_harness import serve, wait_idle
from traces.events import Arrived
from traces.generators import generate
from traces.log import read_log
from traces.request_names import RequestName, parse_request_name


@pytest.fixture(scope="module")
def served_run(smollm2_tokenizer, tmp_path_factory):
    """A small replay against a server with a log: (records, log path, the prompts sent)."""
    log = tmp_path_factory.mktemp("ids") / "server.jsonl"
    wl = generate(8, rate=40.0, input_len="uniform:8:32", output_len="fixed:3", seed=5)
    with serve(smollm2_tokenizer, log=log) as s:
        records, _ = serve_client.run(s.url + "/v1", wl, "m", vocab=len(smollm2_tokenizer))
        wait_idle(s.engine)
    bodies = serve_client.request_bodies(wl, "m", vocab=len(smollm2_tokenizer))
    return records, log, [b["prompt"] for b in bodies]


def test_bench_serve_pairs_every_request_by_its_response_id(served_run):
    records, log, prompts = served_run
    assert all(r.ok for r in records), [r.error for r in records]
    gap = compare(records, log)
    assert gap["paired_by_id"] == gap["paired"] == gap["compared"] == 8
    arrived = {e.request_id: e for e in read_log(log) if isinstance(e, Arrived)}
    for r in records:  # each id names the engine request that got the record's prompt
        assert arrived[parse_request_name(r.response_id).request_id].prompt.token_ids == prompts[r.index]


def test_ids_that_name_no_logged_request_fall_back_to_the_prompt(served_run):
    records, log, _ = served_run
    peer = [serve_client.RequestRecord(**{**vars(r), "response_id": f"cmpl-{'ab' * 16}"}) for r in records]
    gap = compare(peer, log)
    assert gap["paired_by_id"] == 0 and gap["paired"] == gap["compared"] == 8


def test_a_name_pairs_only_with_its_own_run_and_replica():
    names = {RequestName("0123abcd", None, 4): 4, RequestName("0123abcd", 1, 2): 9}
    client = [(0, "cmpl-0123abcd-4"), (1, "chatcmpl-0123abcd-1-2"), (2, "cmpl-99999999-4"), (3, "cmpl-0123abcd-0-2"),
              (4, None), (5, "cmpl-" + "0123abcd" * 4)]
    assert join_names(client, names) == {0: 4, 1: 9}
