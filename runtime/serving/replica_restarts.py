"""How a fleet starts a dead replica again (``serve --data-parallel-size N``): a bounded number of
restarts per replica over the server's life, each after a back-off that doubles, so an engine that
dies on every start (a bad GPU, a model that no longer loads) costs a few tries, not a spin.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

DEFAULT_RESTARTS = 3
DEFAULT_BACKOFF_S = 1.0

T = TypeVar("T")


@dataclass(frozen=True)
class RestartPolicy:
    restarts: int = DEFAULT_RESTARTS  # starts again per replica, failed ones included
    backoff_s: float = DEFAULT_BACKOFF_S  # the wait before the first; each next one waits twice as long

    def delay(self, done: int) -> float | None:
        """The wait before restart ``done + 1`` (None: none left)."""
        return None if done >= self.restarts else self.backoff_s * 2 ** done


def retry_start(policy: RestartPolicy, done: int, start: Callable[[int], T], stopping: threading.Event,
            say: Callable[[str], None]) -> tuple[T | None, int]:
    """``start(k)`` for restart k = done + 1, done + 2, ... after each one's back-off, until one
    starts (its result), none is left or ``stopping`` is set (None). Returns it and the restarts
    done by then."""
    while (delay := policy.delay(done)) is not None:
        if stopping.wait(delay):
            return None, done
        done += 1
        try:
            return start(done), done
        except Exception as e:  # (its output is above): the next try, if any
            say(f"restart {done} of {policy.restarts} failed ({type(e).__name__}: {e})")
    return None, done
