"""Many small host arrays sent to the device in ONE copy.

Per-step metadata (sampling parameters, uniforms, indices) is a handful of tiny arrays; a copy
each would cost a launch and a sync point each. ``stage`` packs their bytes at 64-byte aligned
offsets into one buffer, copies it once, and returns device views with the original dtypes.
"""

from __future__ import annotations

import numpy as np
import torch

# Triton specializes a kernel on whether each pointer argument is 16-byte aligned: views at
# offsets that are only 8-byte aligned would flip that from step to step and recompile kernels
ALIGN = 64

_TORCH_DTYPE = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32,
                np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def stage(arrays: dict[str, np.ndarray], device: torch.device) -> tuple[dict[str, torch.Tensor], int]:
    """1-D device views of ``arrays`` (same names) and the number of bytes copied.

    On CUDA the bytes go through pinned memory (PyTorch's caching host allocator, which keeps a
    block until its copy has run): a copy from pageable memory makes the host wait for all the work
    queued on the stream first, so a step's launch would wait for the step before (its inputs) or
    for its own forward (its sampling parameters), and host and device would no longer overlap.
    The numpy arrays may be reused as soon as this returns.
    """
    parts, spans, pos = [], {}, 0
    for name, a in arrays.items():
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        parts.append(raw)
        pad = -raw.size % ALIGN
        if pad:
            parts.append(np.zeros(pad, np.uint8))
        spans[name] = (pos, raw.size, _TORCH_DTYPE[a.dtype])
        pos += raw.size + pad
    if pos and device.type == "cuda":
        host = torch.empty(pos, dtype=torch.uint8, pin_memory=True)
        np.concatenate(parts, out=host.numpy())
        buf = host.to(device, non_blocking=True)
    elif pos:
        buf = torch.from_numpy(np.concatenate(parts)).to(device)
    else:
        buf = torch.empty(0, dtype=torch.uint8, device=device)
    return {name: buf[o:o + n].view(dt) for name, (o, n, dt) in spans.items()}, pos
