"""Timed work runs with the start-up heap frozen: no full collection over torch, transformers and
the model lands inside a benchmark's run (the server freezes its heap once warm, the same way)."""

from __future__ import annotations

import gc
import weakref

import pytest

from runtime.bench import spec_bench
from runtime.executor.heap import frozen_heap
from runtime.executor.setup import build_engine
from tests.model_helpers import make_tiny, one_thread

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_frozen_heap_exempts_what_lived_before_and_still_collects_what_comes_after():
    assert gc.get_freeze_count() == 0
    before = _Cycle()
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        gc.collect()
        frozen = gc.get_freeze_count()
        after = _Cycle()
        gone = weakref.ref(after)
        del after
        gc.collect()
        assert gone() is None  # garbage made inside the block is collected
        # collections inside the block leave the frozen heap alone (a frozen object may still die by
        # its reference count meanwhile, on another thread of the test process too)
        assert 0.99 * frozen < gc.get_freeze_count() <= frozen
        assert gc.is_tracked(before) and not any(o is before for o in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == 0


class _FreezeWatcher:
    """A drafter of nothing that notes whether the heap was frozen each time it is asked."""

    num_tokens = 2

    def __init__(self) -> None:
        self.frozen: list[bool] = []

    def propose(self, requests, limits):
        self.frozen.append(gc.get_freeze_count() > 0)
        return [[] for _ in requests]


def test_bench_spec_times_its_runs_with_the_heap_frozen(tmp_path):
    tiny = make_tiny("llama", tmp_path, tokenizer=True)
    parts = build_engine(loaded=tiny.loaded, num_blocks=64)
    watcher = _FreezeWatcher()
    run, outputs = spec_bench.run_once(parts, [[1, 2, 3, 4]], 4, "ngram:2", watcher)
    assert run.output_tokens == 4 and len(outputs[0]) == 4
    assert watcher.frozen and all(watcher.frozen)
    assert gc.get_freeze_count() == 0  # and given back after the run
