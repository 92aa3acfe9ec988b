"""Schema 2 of the log (block operations as runs, Step lines that leave out what the log already
says) against logs kept from schema 1: they read, fold and regress as they did, and
``minivllm log upgrade`` rewrites them.

tests/data/schema1/sim_prefix_preempt.jsonl.gz is a schema-1 ``minivllm simulate`` log (prefix
hits, evictions, preemptions, chunked prefill); beside it, the block state schema 1's ``fold``
rebuilt after each of its steps, saved before the change (see tests/data/schema1/README.md).
tests/data/golden/ holds schema-1 live logs (tests/test_regress_golden.py).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from analysis.regress import regress
from simulator.cost.recorded_model import RecordedCostModel
from simulator.replay.replay import resimulate
from traces.events import SCHEMA_VERSION, Header, Step
from traces.fold import FoldedState
from traces.log import LogWriter, fold, read_log
from traces.log_upgrade import upgrade_log

DATA = Path(__file__).resolve().parent / "data"
OLD_SIM = DATA / "schema1" / "sim_prefix_preempt.jsonl.gz"
OLD_STATES = DATA / "schema1" / "sim_prefix_preempt.states.json.gz"
GOLDEN = sorted((DATA / "golden").glob("*.jsonl.gz"))


def _as_saved(state: FoldedState, step: int) -> dict:
    bs = state.block_state()
    return {"step": step, "tables": {str(k): list(v) for k, v in bs.tables.items()},
            "ref_counts": list(bs.ref_counts), "free": list(bs.free), "evictable": list(bs.evictable),
            "cached": sorted(bs.cached), "reserved": {str(k): v for k, v in bs.reserved.items()},
            "computed": {str(k): v for k, v in state.computed.items()}}


def test_a_schema_1_log_reads_as_todays_events_and_says_so():
    reader = read_log(OLD_SIM)
    header = next(reader)
    assert isinstance(header, Header) and header.schema_version == SCHEMA_VERSION == 2
    events = list(reader)
    assert reader.file_schema_version == 1
    with gzip.open(OLD_SIM, "rt") as f:
        assert json.loads(f.readline())["schema_version"] == 1
    kinds = {type(b).__name__ for e in events for b in getattr(e, "block_events", ())}
    assert kinds == {"BlockAllocated", "BlockFreed", "BlockCached", "PrefixHit", "Reserved"}


def test_fold_of_a_schema_1_log_is_what_schema_1s_fold_was_after_every_step():
    with gzip.open(OLD_STATES) as f:
        saved = json.loads(f.read())
    state, got = None, []
    for ev in read_log(OLD_SIM):
        if isinstance(ev, Header):
            state = FoldedState(ev.num_blocks)
            continue
        state.apply(ev)
        if isinstance(ev, Step):
            got.append(_as_saved(state, ev.step))
    assert len(got) == len(saved) == 519
    assert got == saved
    assert state.evictions > 0


def test_upgrade_rewrites_smaller_and_reads_back_the_same_events(tmp_path):
    from runtime.cli import main

    new = tmp_path / "new.jsonl.gz"
    assert main(["log", "upgrade", str(OLD_SIM), str(new)]) == 0
    assert list(read_log(new)) == list(read_log(OLD_SIM))
    assert read_log(new).file_schema_version == 2 and new.stat().st_size < OLD_SIM.stat().st_size / 2
    with pytest.raises(SystemExit) as e:  # an existing NEW is kept unless --force
        main(["log", "upgrade", str(OLD_SIM), str(new)])
    assert e.value.code == 2
    assert main(["log", "upgrade", str(OLD_SIM), str(new), "--force"]) == 0
    with pytest.raises(ValueError, match="another file"):
        upgrade_log(new, new)


def test_a_resimulation_of_a_schema_1_log_makes_its_decisions_block_for_block(tmp_path):
    resim = tmp_path / "resim.jsonl"
    with LogWriter(resim) as log:
        resimulate(OLD_SIM, RecordedCostModel.from_log(OLD_SIM), sink=log)
    report = regress(OLD_SIM, resim, default_tolerance=1e-6, two_sided=True)
    assert report.passed and report.differing_steps == 0 and report.steps[0] == report.steps[1] == 519
    old = [e for e in read_log(OLD_SIM) if isinstance(e, Step)]
    new = [e for e in read_log(resim) if isinstance(e, Step)]
    assert [(e.spans, e.block_events) for e in old] == [(e.spans, e.block_events) for e in new]
    assert fold(read_log(resim)).block_state() == fold(read_log(OLD_SIM)).block_state()


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_live_logs_upgrade_and_fold_alike(path, tmp_path):
    new = tmp_path / "new.jsonl"
    done = upgrade_log(path, new)
    assert (done.from_version, done.to_version) == (1, 2)
    old_events = list(read_log(path))
    assert list(read_log(new)) == old_events
    with gzip.open(path, "rb") as f:
        old_bytes = len(f.read())
    assert new.stat().st_size < old_bytes
    assert fold(read_log(new)).block_state() == fold(old_events).block_state()


def test_a_log_of_an_unknown_schema_is_refused(tmp_path):
    from traces.log import LogError

    path = tmp_path / "future.jsonl"
    path.write_text('{"type":"Header","schema_version":3}\n')
    with pytest.raises(LogError, match="schema version 3, this minivllm reads 1 and 2"):
        list(read_log(path))
