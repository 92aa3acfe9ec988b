"""What every row-based importer shares: bad rows raise, or are counted and skipped."""

from __future__ import annotations

import json
from typing import Any

from traces.workload import WorkloadError

KEEP_REASONS = 10  # reasons kept for the first skipped rows


class Skips:
    """Bad rows: raise at the first, or count them (and keep a few reasons) when skipping."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip
        self.count = 0
        self.reasons: list[str] = []

    def bad(self, message: str) -> None:
        if not self.skip:
            raise WorkloadError(message)
        self.count += 1
        if len(self.reasons) < KEEP_REASONS:
            self.reasons.append(message)

    def require_rows(self, path: Any, kept: int) -> None:
        """Skipping every row leaves nothing to run: an error, not an empty workload."""
        if self.count and not kept:
            raise WorkloadError(f"no valid rows in {path} ({self.count:,} skipped; first: {self.reasons[0]})")

    def meta(self) -> dict[str, Any]:
        return {"skipped_rows": self.count, "skipped_reasons": self.reasons} if self.count else {}


def positive_int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


def json_object(line: str) -> dict[str, Any] | None:
    """``line`` parsed as a JSON object, or None (format detection reads first lines with it)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None
