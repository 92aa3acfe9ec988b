"""Small C kernels for the CPU path, compiled on first use with the system C compiler and loaded
with ctypes (no torch extension build: compiling takes about a second).

``paged_attention``: attention of decodes and short spans (a speculative verify span) reading the
paged KV in place; on a 2-core CPU the torch gather + SDPA it replaces spends most of its time
copying K/V (and, for a span, expanding it to every query head). Unavailable (None) when there is no
compiler, or with ``MINIVLLM_CPU_KERNELS=0``; callers then use the torch path.
Built objects live in ``$MINIVLLM_CACHE/cpu_kernels`` keyed by source, compiler flags and CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

_SRC = Path(__file__).with_name("paged_attention.c")
# reassociation lets the dot products vectorise; no finite-math assumptions (softmax needs inf)
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-fassociative-math",
          "-fno-signed-zeros", "-fno-trapping-math"]


def _cpu_key() -> str:
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return platform.machine() + flags


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    if os.environ.get("MINIVLLM_CPU_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None
    from runtime.executor.cache_dir import cache_root

    key = hashlib.blake2b((_SRC.read_text() + " ".join(_FLAGS) + _cpu_key()).encode(), digest_size=8).hexdigest()
    target = cache_root() / "cpu_kernels" / f"paged_attention-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            subprocess.run([compiler, *_FLAGS, str(_SRC), "-o", tmp, "-lm"], check=True, capture_output=True)
            os.replace(tmp, target)
        except (OSError, subprocess.CalledProcessError):
            Path(tmp).unlink(missing_ok=True)
            return None
    try:
        lib = ctypes.CDLL(str(target))
    except OSError:
        return None
    fn = lib.paged_attention_f32
    fn.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int]
    fn.restype = None
    return lib


def available() -> bool:
    return _library() is not None


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, seq_ids: torch.Tensor, q_starts: torch.Tensor, q_lens: torch.Tensor,
                    scale: float, out: torch.Tensor) -> None:
    """Into ``out [T, H, D]``: the rows ``q_starts[i] .. + q_lens[i]`` of ``q [T, H, D]`` (fp32, CPU)
    attend causally to sequence ``seq_ids[i]``'s ``seq_lens`` keys (its last ``q_lens[i]`` positions are
    these rows). ``block_tables [S, W]``, ``seq_lens [S]`` and the three ``[n]`` index tensors: int32."""
    lib = _library()
    assert lib is not None, "check available() first"
    assert q.is_contiguous() and out.is_contiguous() and block_tables.is_contiguous() and seq_lens.is_contiguous()
    _, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    lib.paged_attention_f32(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                            seq_lens.data_ptr(), seq_ids.data_ptr(), q_starts.data_ptr(), q_lens.data_ptr(),
                            out.data_ptr(), len(seq_ids), h, kvh, d, bs, block_tables.shape[1], scale,
                            torch.get_num_threads())
