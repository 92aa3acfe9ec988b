"""Synthetic workloads: Poisson or gamma arrivals and length distributions, all seeded.

Arrivals: inter-arrival gaps with mean ``1 / rate`` and coefficient of variation ``cv`` (the
burstiness factor): ``cv == 1`` is Poisson (exponential gaps), ``cv > 1`` burstier (gamma with
shape ``1 / cv²``), ``cv < 1`` more regular.

Lengths, as a spec string (CLI) or a ``LengthDist``:
  ``fixed:N`` · ``uniform:LO:HI`` (inclusive) · ``lognormal:MEAN:CV[:MAX]`` ·
  ``trace:PATH:input|output`` (resampled from a workload file's empirical distribution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from traces.formats import load_workload
from traces.workload import RequestSpec, Workload, WorkloadError, synthetic_prompt, trace_params


@dataclass(frozen=True)
class LengthDist:
    kind: str  # fixed | uniform | lognormal | empirical
    a: float = 0.0
    b: float = 0.0
    cap: int = 1 << 20
    values: tuple[int, ...] = field(default=(), repr=False)  # empirical samples

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            out = np.full(n, int(self.a))
        elif self.kind == "uniform":
            out = rng.integers(int(self.a), int(self.b), size=n, endpoint=True)
        elif self.kind == "lognormal":
            sigma2 = math.log1p(self.b**2)
            out = np.rint(rng.lognormal(math.log(self.a) - sigma2 / 2, math.sqrt(sigma2), size=n))
        elif self.kind == "empirical":
            out = rng.choice(np.asarray(self.values), size=n, replace=True)
        else:
            raise WorkloadError(f"unknown length distribution {self.kind!r}")
        return np.clip(out, 1, self.cap).astype(np.int64)

    @classmethod
    def parse(cls, spec: str, *, seed: int = 0) -> LengthDist:
        """Parse a CLI spec (see the module docstring); errors name the spec."""
        parts = spec.split(":")
        kind, args = parts[0], parts[1:]
        try:
            if kind == "fixed" and len(args) == 1:
                dist = cls("fixed", a=int(args[0]))
            elif kind == "uniform" and len(args) == 2:
                dist = cls("uniform", a=int(args[0]), b=int(args[1]))
                if dist.b < dist.a:
                    raise ValueError("HI < LO")
            elif kind == "lognormal" and len(args) in (2, 3):
                dist = cls("lognormal", a=float(args[0]), b=float(args[1]),
                           cap=int(args[2]) if len(args) == 3 else 1 << 20)
                if not (dist.a > 0 and dist.b >= 0):
                    raise ValueError("MEAN must be > 0 and CV >= 0")
            elif kind == "trace" and len(args) >= 2 and args[-1] in ("input", "output"):
                return cls.from_workload(":".join(args[:-1]), args[-1], seed=seed)
            else:
                raise ValueError("wrong number of fields")
        except ValueError as e:
            raise WorkloadError(
                f"length spec {spec!r}: {e}; expected fixed:N, uniform:LO:HI, lognormal:MEAN:CV[:MAX] "
                "or trace:PATH:input|output") from None
        if dist.kind in ("fixed", "uniform") and dist.a < 1:
            raise WorkloadError(f"length spec {spec!r}: lengths must be >= 1")
        return dist

    @classmethod
    def from_workload(cls, path: str, which: str, *, seed: int = 0) -> LengthDist:
        wl = load_workload(path, seed=seed)
        if not len(wl):
            raise WorkloadError(f"{path}: no requests to take a length distribution from")
        attr = "num_prompt_tokens" if which == "input" else "num_output_tokens"
        return cls("empirical", values=tuple(getattr(r, attr) for r in wl))


def arrival_times(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times starting at 0 with mean rate ``rate`` and gap CV ``cv``."""
    if not rate > 0:
        raise WorkloadError(f"rate must be > 0 requests/s, got {rate}")
    if not cv >= 0:
        raise WorkloadError(f"cv (burstiness) must be >= 0, got {cv}")
    if n <= 0:
        return np.zeros(0)
    if cv == 0:
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def generate(
    n: int,
    *,
    rate: float,
    cv: float = 1.0,
    input_len: LengthDist | str = "uniform:32:256",
    output_len: LengthDist | str = "uniform:16:256",
    shared_prefix: int = 0,
    seed: int = 0,
) -> Workload:
    """``n`` synthetic requests; ``shared_prefix`` tokens of every prompt are one common segment
    (a system prompt), so prefix caching has something to hit."""
    if n < 0:
        raise WorkloadError(f"number of requests must be >= 0, got {n}")
    if isinstance(input_len, str):
        input_len = LengthDist.parse(input_len, seed=seed)
    if isinstance(output_len, str):
        output_len = LengthDist.parse(output_len, seed=seed)
    # independent streams: changing one distribution leaves the others' draws unchanged
    arrivals = arrival_times(n, rate, cv, np.random.default_rng([seed, 1]))
    n_in = input_len.sample(np.random.default_rng([seed, 2]), n)
    n_out = output_len.sample(np.random.default_rng([seed, 3]), n)
    segments = [0] if shared_prefix > 0 else []
    seg_len = shared_prefix if shared_prefix > 0 else 512
    requests = [
        RequestSpec(arrival=float(arrivals[i]),
                    prompt=synthetic_prompt(int(n_in[i]), seed, unique_seed=i,
                                            segment_ids=segments if n_in[i] > shared_prefix else [],
                                            segment_len=seg_len),
                    params=trace_params(int(n_out[i])))
        for i in range(n)
    ]
    meta = {"format": "generated", "rate": rate, "cv": cv, "input_len": _describe(input_len),
            "output_len": _describe(output_len), "shared_prefix": shared_prefix}
    return Workload(requests, seed=seed, source="generated", meta=meta)


def _describe(d: LengthDist) -> str:
    if d.kind == "empirical":
        return f"empirical({len(d.values)} samples)"
    return f"{d.kind}:{d.a:g}:{d.b:g}" if d.kind != "fixed" else f"fixed:{int(d.a)}"
