"""What the real executor needs beyond the engine config: where it runs and how its KV pool is
sized. Fields made with ``option`` become CLI flags (runtime/cli/config_flags.py)."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.engine.config import ConfigError, option

DEFAULT_CPU_KV_GB = 2.0
DTYPES = ("auto", "float32", "float16", "bfloat16")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
SAMPLERS = ("auto", "torch", "triton")


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    device: str = option("auto", "auto | cpu | cuda[:N] (auto: cuda when there is a GPU)")
    dtype: str = option("auto", " | ".join(DTYPES) + " (auto: float32 on the CPU, the checkpoint's "
                        "half-precision type on CUDA)")
    attention_backend: str = option("auto", " | ".join(ATTENTION_BACKENDS) + " (auto: triton on CUDA)")
    kv_cache_gb: float | None = option(None, f"KV pool budget in GiB (default: {DEFAULT_CPU_KV_GB:g} on the CPU; "
                                       "on CUDA what --gpu-memory-utilization leaves); --num-blocks overrides it")
    gpu_memory_utilization: float = option(0.9, "share of the GPU's memory the engine may hold (CUDA)")
    enforce_eager: bool = option(False, "no CUDA graphs: every step runs eagerly")
    async_scheduling: bool = option(True, "plan and launch step n+1 while step n runs on the GPU (the log is "
                                    "the same either way)")
    sampler: str = option("auto", " | ".join(SAMPLERS) + " (auto: triton on CUDA, the faster one measured, torch "
                          "on the CPU; triton: the sorting-free kernel; both draw from the same distribution)")
    cpu_threads: int = option(0, "torch threads on the CPU (0: $OMP_NUM_THREADS if set, else every core, less "
                              "one for the front end on machines of more than two)")

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"runner.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"runner.attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                              f"got {self.attention_backend!r}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"runner.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise ConfigError(f"runner.kv_cache_gb must be > 0, got {self.kv_cache_gb!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"runner.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if not isinstance(self.cpu_threads, int) or isinstance(self.cpu_threads, bool) or self.cpu_threads < 0:
            raise ConfigError(f"runner.cpu_threads must be an integer >= 0, got {self.cpu_threads!r}")
        for name in ("enforce_eager", "async_scheduling"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"runner.{name} must be a bool, got {getattr(self, name)!r}")
