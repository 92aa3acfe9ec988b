"""Counts the Triton kernel specialisations this process compiles (or loads from Triton's disk
cache) — each one is a pause of milliseconds to seconds in the step that needs it. A server warms
up until this stops growing; after that a compile while serving is a stall worth reporting.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class JitCounter:
    def __init__(self) -> None:
        self.count = 0
        self.kernels: Counter[str] = Counter()
        self.installed = False

    def install(self) -> bool:
        """Hook Triton's compile path (once per process); False when Triton is not importable."""
        if self.installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        previous = knobs.runtime.jit_cache_hook

        def hook(*args: Any, **kwargs: Any) -> Any:
            fn = kwargs.get("fn")
            self.count += 1
            self.kernels[getattr(fn, "name", "?")] += 1
            return previous(*args, **kwargs) if previous else None

        knobs.runtime.jit_cache_hook = hook
        self.installed = True
        return True


JIT = JitCounter()  # one per process: Triton's hook is process-wide
