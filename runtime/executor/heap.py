"""The process heap, kept out of timed work.

A full garbage collection walks every object the process holds: with torch, transformers and a
model loaded that is some 0.4 M objects and 0.1–0.2 s, and one lands inside whatever step is running
(a served request's, a benchmark's). Frozen objects are exempt from collections, so the server
freezes its start-up heap once it is warm, and a benchmark freezes the heap around each timed run;
what is allocated afterwards is still collected.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_heap() -> None:
    """Collect now, then exempt everything alive from later collections (``gc.unfreeze`` ends it)."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """``freeze_heap`` for the block only (frozen objects are never freed)."""
    freeze_heap()
    try:
        yield
    finally:
        gc.unfreeze()
