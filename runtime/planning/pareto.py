"""The Pareto front of a sweep: the points no other point beats on both a latency (lower is better)
and a throughput (higher is better)."""

from __future__ import annotations

import pandas as pd


def pareto_front(table: pd.DataFrame, minimize: str, maximize: str) -> pd.DataFrame:
    """The rows of ``table`` on the front, by ``minimize`` ascending (rows with NaN in either are out;
    of rows equal in both, the first)."""
    rows = table.dropna(subset=[minimize, maximize])
    rows = rows.sort_values([minimize, maximize], ascending=[True, False], kind="stable")
    keep, best = [], float("-inf")
    for index, value in zip(rows.index, rows[maximize]):
        if value > best:
            keep.append(index)
            best = value
    return rows.loc[keep]
