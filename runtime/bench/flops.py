"""The compute side of a prefill-heavy run: FLOPs its steps did / measured dense GEMM peak.

A step's FLOPs from its spans and the model's dimensions: every scheduled token does 2 × the
parameters of the layers' linear maps (QKV, O, gate/up/down); a sampling span adds 2 × the LM head
for its one sampled row; attention adds, per token at position p and per layer, 4 × (p + 1) ×
head_dim × heads (QKᵀ and AV over its causal context). Norms, RoPE, activations and biases are
left out (small next to these), so the count is a floor of the work done.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from runtime.executor.model.spec import ModelSpec
from traces.events import Span


def linear_params_per_token(spec: ModelSpec) -> int:
    """Weights one token multiplies through in the decoder layers (LM head excluded)."""
    h = spec.hidden_size
    qkv = h * (spec.q_size + 2 * spec.kv_size)
    out = spec.q_size * h
    mlp = 3 * h * spec.intermediate_size
    return spec.num_layers * (qkv + out + mlp)


def bears_prefill(spans: Iterable[Span]) -> bool:
    """A step with a span of more than one token (a prompt chunk; decode spans have one)."""
    return any(s.num_tokens > 1 for s in spans)


@dataclass
class FlopCounter:
    """FLOPs per unit of a step's shape, and the FLOPs and wall time of the prefill-bearing steps
    so far; feed it every step."""

    per_token: int  # 2 × the decoder layers' linear parameters
    per_sample: int  # 2 × the LM head, for each sampled row
    per_context: int  # attention, per (token, key it attends to): 4 × head_dim × heads × layers
    steps: int = 0
    flops: int = 0
    seconds: float = 0.0

    @classmethod
    def of(cls, spec: ModelSpec) -> FlopCounter:
        return cls(2 * linear_params_per_token(spec), 2 * spec.hidden_size * spec.vocab_size,
                   4 * spec.head_dim * spec.num_heads * spec.num_layers)

    def step_flops(self, spans: Iterable[Span]) -> int:
        tokens = sampled = context = 0
        for s in spans:
            n = s.num_tokens
            tokens += n
            sampled += s.sample
            context += n * s.start + n * (n + 1) // 2  # Σ (p + 1) over positions start .. start + n - 1
        return tokens * self.per_token + sampled * self.per_sample + context * self.per_context

    def add_step(self, spans: list[Span], seconds: float) -> None:
        if bears_prefill(spans):
            self.steps += 1
            self.flops += self.step_flops(spans)
            self.seconds += seconds


def step_flops(spec: ModelSpec, spans: Iterable[Span]) -> int:
    return FlopCounter.of(spec).step_flops(spans)


@dataclass
class PrefillCompute:
    steps: int
    flops: int
    seconds: float
    achieved_tflops: float
    peak_tflops: float  # measured dense matmul peak for the run's dtype and device
    fraction: float  # achieved / peak

    def describe(self) -> str:
        return (f"prefill compute: {self.flops / 1e12:.4g} TFLOP in the {self.steps} prefill-bearing steps "
                f"({self.seconds:.2f} s) = {self.achieved_tflops:.4g} TFLOP/s = {self.fraction:.1%} of "
                f"the {self.peak_tflops:.4g} TFLOP/s measured dense matmul peak")

    def as_dict(self) -> dict:
        return asdict(self)


def prefill_compute(counter: FlopCounter, peak_flops: float) -> PrefillCompute:
    achieved = counter.flops / counter.seconds if counter.seconds else 0.0
    return PrefillCompute(counter.steps, counter.flops, counter.seconds, achieved / 1e12, peak_flops / 1e12,
                          achieved / peak_flops if peak_flops else float("nan"))
