"""Analytic (roofline) step-time model: a stand-in until a fitted model exists for a machine.

Each feature's coefficient is the time its work takes at the hardware's copy bandwidth or peak
matmul throughput, summed rather than max'ed (a linear model; pessimistic when a step is both
compute- and memory-heavy). ``step_overhead`` is the fixed per-step cost a roofline doesn't
see (kernel launches, engine CPU time): an assumption, stated in the model's JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simulator.cost.linear_model import LinearCostModel


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str = "bfloat16"
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        q = self.hidden * self.num_heads * self.head_dim
        kv = 2 * self.hidden * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        return self.num_layers * (q + kv + o + mlp)

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden  # LM head (tied or not, it is read every sampling step)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def attention_flops_per_pair(self) -> int:
        return self.num_layers * 4 * self.num_heads * self.head_dim  # QKᵀ and PV, 2 flops per MAC


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes/s (copy bandwidth)
    flops: float  # dense matmul flop/s in the model's dtype


QWEN3_0_6B = ModelShape("Qwen3-0.6B", num_layers=28, hidden=1024, num_heads=16, num_kv_heads=8,
                        head_dim=128, intermediate=3072, vocab=151936)
H200 = Hardware("NVIDIA H200", bandwidth=4.3e12, flops=790e12)

# Fixed per-step cost assumed for a small model on a GPU: a 28-layer decode step replayed from a
# CUDA graph still runs a few hundred small kernels, and the engine spends CPU time per step.
DEFAULT_STEP_OVERHEAD = 1.0e-3


def analytic_cost_model(model: ModelShape, hw: Hardware, step_overhead: float = DEFAULT_STEP_OVERHEAD
                        ) -> LinearCostModel:
    b, f = model.dtype_bytes, hw.flops
    weights_time = (model.layer_params + model.head_params) * b / hw.bandwidth
    token_flops_time = 2 * model.layer_params / f  # one token through every layer's matmuls
    kv_write_time = model.kv_bytes_per_token / hw.bandwidth
    coefficients = {
        "const": weights_time + step_overhead,
        "prefill_tokens": token_flops_time + kv_write_time,
        "prefill_attention": model.attention_flops_per_pair / f,
        "decode_seqs": token_flops_time + kv_write_time,
        "decode_context": model.kv_bytes_per_token / hw.bandwidth + model.attention_flops_per_pair / f,
        "seqs": 2 * model.head_params / f,  # LM head for the sampled token
        # eager (no CUDA graph) prefill steps cost launches and Python, not bytes or flops: a
        # roofline sees nothing of it; only a fit from a log measures it
        "prefill_step": 0.0,
        # the decode kernel's wait for its longest sequence: beyond a roofline of bytes and flops
        "longest_program": 0.0,
        # a padded token runs every layer's matmuls (it writes no KV); the roofline model pads
        # nothing unless given a step padding (traces/step_padding.py)
        "padded_tokens": token_flops_time,
    }
    meta = {
        "provenance": "analytic",
        "note": ("ANALYTIC roofline estimate, to be replaced by a fit (minivllm cost-model fit) "
                 "from logs recorded on this hardware. step_overhead is an assumption, not a measurement."),
        "model_identity": model.name,
        "hardware": hw.name,
        "dtype": model.dtype,
        "fit_date": None,
        "analytic": {"model": asdict(model), "hardware": asdict(hw), "step_overhead_s": step_overhead,
                     "weights_bytes": (model.layer_params + model.head_params) * b,
                     "kv_bytes_per_token": model.kv_bytes_per_token},
        "heldout": None,
    }
    return LinearCostModel(coefficients, meta)


PRESETS = {
    "qwen3-0.6b-h200": (QWEN3_0_6B, H200),
}
