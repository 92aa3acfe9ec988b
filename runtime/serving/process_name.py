"""A server's processes name themselves, so ``ps``, ``top`` and /proc/PID/comm tell them apart: the
engine (``minivllm-engine``), the extra HTTP front ends (``minivllm-http``) and the intake workers
(``minivllm-intake``). Linux only; elsewhere nothing changes."""

from __future__ import annotations

import contextlib
import ctypes

ENGINE, FRONT_END, INTAKE = "minivllm-engine", "minivllm-http", "minivllm-intake"


def name_process(name: str) -> None:
    """The name ps and /proc/PID/comm show (at most 15 bytes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
