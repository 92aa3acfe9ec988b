"""Runs: a list of block ids written as ``[first, count, first, count, ...]``.

``count`` > 0 is the ascending run ``first, first + 1, ..., first + count - 1``; ``count`` < 0 the
descending run ``first, first - 1, ..., first + count + 1`` (a freed table comes back to the LRU
tail first, so blocks reused from it come in descending order). ``[0, 24]`` is blocks 0..23,
``[179, -80]`` is blocks 179 down to 100, ``[7, 1]`` is block 7 alone. The order of the ids is
kept: a block table is a sequence.

Every list of ids has exactly one encoding (``runs_of`` makes each run as long as it can, an
ascending pair before a descending one), so two logs that made the same decisions hold the same runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["block_ids", "extend_runs", "iter_block_ids", "num_blocks", "runs_of"]


def runs_of(ids: Iterable[int]) -> list[int]:
    """The runs of ``ids`` (see the module docstring)."""
    if ids.__class__ is list and ids:  # one run, checked at C speed (a chunk from a fresh pool)
        first, n = ids[0], len(ids)  # type: ignore[index]
        if n == 1:
            return [first, 1]
        if ids[-1] - first == n - 1 and ids == list(range(first, first + n)):  # type: ignore[index]
            return [first, n]
        if first - ids[-1] == n - 1 and ids == list(range(first, first - n, -1)):  # type: ignore[index]
            return [first, -n]
    runs: list[int] = []
    extend_runs(runs, ids)
    return runs


def extend_runs(runs: list[int], ids: Iterable[int]) -> None:
    """Append ``ids`` to the sequence ``runs`` encodes, in place, merging with its last run."""
    if runs:
        first, count = runs[-2], runs[-1]
        del runs[-2:]
    else:
        first = count = None
    append = runs.append
    for b in ids:
        if first is not None:
            if count == 1:  # a lone block: the next one decides the direction
                if b == first + 1:
                    count = 2
                    continue
                if b == first - 1:
                    count = -2
                    continue
            elif b == first + count:  # the id after the run's last, ascending (count > 0) or descending
                count = count + 1 if count > 0 else count - 1  # type: ignore[operator]
                continue
            append(first)
            append(count)  # type: ignore[arg-type]
        first, count = b, 1
    if first is not None:
        append(first)
        append(count)  # type: ignore[arg-type]


def iter_block_ids(runs: list[int]) -> Iterator[int]:
    for i in range(0, len(runs), 2):
        first, count = runs[i], runs[i + 1]
        if count > 0:
            yield from range(first, first + count)
        else:
            yield from range(first, first + count, -1)


def block_ids(runs: list[int]) -> list[int]:
    """The ids ``runs`` encodes, in order."""
    if len(runs) == 2:
        first, count = runs
        return list(range(first, first + count)) if count > 0 else list(range(first, first + count, -1))
    return list(iter_block_ids(runs))


def num_blocks(runs: list[int]) -> int:
    return sum(abs(runs[i]) for i in range(1, len(runs), 2))
