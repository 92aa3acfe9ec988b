"""Results by job key, one JSON file each (``DIR/ab/abcdef....json``), written whole or not at all
(a temporary file renamed into place), so a sweep killed at any moment leaves only complete results
and its re-run simulates just what is missing. Failures are not kept: a re-run tries them again."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class ResultCache:
    def __init__(self, root: str | Path | None) -> None:
        """``root`` None: a cache that keeps nothing."""
        self.root = Path(root) if root is not None else None

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if self.root is None:
            return None
        path = self._path(key)
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return doc.get("metrics") if doc.get("key") == key else None

    def put(self, key: str, metrics: dict[str, Any]) -> None:
        if self.root is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "metrics": metrics}, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
