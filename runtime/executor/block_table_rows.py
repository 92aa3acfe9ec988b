"""Host copy of the live block tables: one persistent int32 row per request, updated in place.

A step's block table is [sequences, blocks]: flattening every request's table into it anew costs
a pass over thousands of Python ints per step (256 sequences x ~50 blocks), the largest host cost
of a decode step. A table only grows while its request holds it (a re-admitted request gets a new
list), so each step copies just the blocks added since the last one and gathers its rows with a
single numpy indexing op. The one exception, a speculating request's table trimmed after its
step, is announced (``invalidate``) and copied whole next time.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence

import numpy as np


class BlockTableRows:
    def __init__(self, width: int = 64, capacity: int = 64) -> None:
        self.array = np.zeros((capacity, width), np.int32)
        # request id -> (its table, blocks copied, row); table None: copy it whole next time
        self._rows: dict[int, tuple[list[int] | None, int, int]] = {}
        self._free = list(range(capacity - 1, -1, -1))

    def gather(self, request_ids: Sequence[int], tables: Sequence[list[int]], live: Container[int]) -> np.ndarray:
        """``[len(tables), max table length]`` int32, zero padded. ``live``: ids of unfinished
        requests (rows of the others are recycled when rows run out)."""
        width = max(1, max(map(len, tables), default=1))
        arr = self.array if width <= self.array.shape[1] else self._widen(width)
        rows = self._rows
        get = rows.get
        index = []
        for rid, table in zip(request_ids, tables):
            entry = get(rid)
            if entry is not None and entry[0] is table:
                row, done = entry[2], entry[1]
                if done != len(table):
                    n = len(table)
                    arr[row, done:n] = table[done:]
                    rows[rid] = (table, n, row)
            else:
                row = entry[2] if entry is not None else self._new_row(live)
                arr = self.array  # _new_row may have grown it
                n = len(table)
                arr[row, :n] = table
                arr[row, n:] = 0
                rows[rid] = (table, n, row)
            index.append(row)
        return arr[index, :width]

    def invalidate(self, request_ids: Iterable[int]) -> None:
        """The tables of ``request_ids`` may shrink before the next gather (speculative drafts'
        blocks trimmed, runtime/engine/core.py): their rows are copied whole next time."""
        rows = self._rows
        for rid in request_ids:
            entry = rows.get(rid)
            if entry is not None:
                rows[rid] = (None, 0, entry[2])

    def _new_row(self, live: Container[int]) -> int:
        if not self._free:
            for rid in [rid for rid in self._rows if rid not in live]:
                self._free.append(self._rows.pop(rid)[2])
        if not self._free:
            old = self.array
            self.array = np.zeros((2 * old.shape[0], old.shape[1]), np.int32)
            self.array[: old.shape[0]] = old
            self._free = list(range(self.array.shape[0] - 1, old.shape[0] - 1, -1))
        return self._free.pop()

    def _widen(self, width: int) -> np.ndarray:
        old = self.array
        self.array = np.zeros((old.shape[0], max(width, 2 * old.shape[1])), np.int32)
        self.array[:, : old.shape[1]] = old
        return self.array
