"""Warnings raised by our own packages are notices for the user (a log cut off mid-write: "read
its N complete lines, dropped the last M bytes"): one line ``minivllm: warning: ...`` on stderr,
each text once, instead of Python's ``file.py:123: SomeWarning: ...`` form. Warnings of other
libraries keep Python's form (their location is what a developer needs)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

OURS = ("traces", "runtime", "simulator", "analysis")


@contextmanager
def as_notices() -> Iterator[None]:
    seen: set[str] = set()
    with warnings.catch_warnings():  # restores showwarning (and the filters) on the way out
        python_form = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if category.__module__.split(".")[0] not in OURS:
                return python_form(message, category, filename, lineno, file, line)
            text = str(message)
            if text not in seen:  # a command may read one log several times
                seen.add(text)
                print(f"minivllm: warning: {text}", file=sys.stderr, flush=True)
            return None

        warnings.showwarning = show
        yield
