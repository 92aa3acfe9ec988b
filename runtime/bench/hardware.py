"""A short description of the device a run measured (for log Headers and cost-model metadata)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_device(device: torch.device) -> str:
    """``NVIDIA H200`` on CUDA; ``<CPU model> (<n> cores, <t> threads used)`` on the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def cuda_alloc_retries(device: torch.device) -> int | None:
    """Times the CUDA caching allocator had to free its cache and retry (each one synchronizes and
    slows that step); None off CUDA."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
