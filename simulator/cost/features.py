"""What a step-time model sees of a step: features computed from its spans alone.

A span's ``start`` is the tokens already in the KV cache, ``num_tokens`` the chunk computed now.

``FEATURES`` (the linear model's):
  const              1 per step (weights read, launches, fixed overhead)
  prefill_tokens     Σ chunk over spans with chunk > 1 (GEMM work)
  prefill_attention  Σ (chunk · start + chunk · (chunk + 1) / 2): query-key pairs of causal prefill
  decode_seqs        decode rows: spans with chunk == 1, and a verify span's rows (below)
  decode_context     Σ (start + 1) over the decodes: KV read by decode attention
  seqs               all spans (per-sequence overhead, sampling)
  prefill_step       1 when any span has chunk > 1: a step that carries prefill runs eagerly (no CUDA
                     graph) and pays a fixed extra cost, however few tokens it has
  longest_program    the context tokens the decode kernel's longest program reads: the longest decode
                     context over the kernel's split count for this many decodes (a model's
                     ``decode_splits``, traces/decode_splits.py; without one, the longest context).
                     On the H200 a served step with one decode past 4,096 tokens costs ~2 ms more
                     than one of the same size and context sum when 64 or more decode (nothing is
                     split), and ~0.2 ms when 7 do (split 8 ways) (docs/BENCHMARKS.md); a profile's
                     decode batches have equal contexts and never show it
  padded_tokens      in a step that carries prefill and replays piecewise graphs, the tokens its
                     GEMMs add by running on the next captured count (traces/step_padding.py: a
                     1,100-token step runs 1,536); 0 in a decode-only step, in an eager one and in a
                     model without ``step_padding``

A speculative decode's verify span (its last token and d drafts, ``Step.drafts``; the callers pass
its request in ``verifying``) counts as 1 + d decode rows: ``decode_seqs`` + 1 + d (one sequence
in ``seqs``), its context read once (``decode_context`` + start + 1 + d), the longest of them in
``longest_program`` (the split count taken for every decode row of the step). That is how the
engine runs it: on CUDA a step of decodes and verify spans replays a decode CUDA graph with a row
per token (runtime/executor/model_inputs.py ``as_decode_rows``), each row a decode-kernel program
over its own context (the rows of one span read the same KV blocks, from L2 after the first); on
the CPU the C kernel reads the span's KV once for all its rows. It is no ``prefill_step`` (nothing
eager) and no query-key pairs. ``minivllm profile``'s verify cases (simulator/fitting/profile_plan.py)
put such steps in the fit. Not priced: a step whose decode rows outnumber the graphs' largest batch
(max_num_seqs) runs the piecewise graphs instead, which cost more.

``EXT_FEATURES`` add what a tree model splits on besides: tokens in the step, prefill spans, the
largest chunk. They are also the quantities whose profiled range a model records (simulator/cost/ranges.py).
A saved model names its features; a file from before a feature existed loads (a linear one without
the coefficient, a tree one with its splits mapped to the features by name). ``max_context``, this
feature's name before models knew the split policy, is read as ``longest_program``: without
``decode_splits`` the two are the same number.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from traces.decode_splits import DecodeSplits
from traces.events import Span
from traces.step_padding import StepPadding

FEATURES = ("const", "prefill_tokens", "prefill_attention", "decode_seqs", "decode_context", "seqs",
            "prefill_step", "longest_program", "padded_tokens")
RENAMED = {"max_context": "longest_program"}  # a model file's older feature names
FEATURE_DOC = {
    "const": "seconds per step",
    "prefill_tokens": "seconds per prefill token (chunk > 1)",
    "prefill_attention": "seconds per causal query-key pair in prefill chunks",
    "decode_seqs": "seconds per decode row (a span with chunk == 1, or a verify span's row)",
    "decode_context": "seconds per context token read by a decode span",
    "seqs": "seconds per span",
    "prefill_step": "seconds per step that carries prefill (any chunk > 1: eager, no CUDA graph)",
    "longest_program": "seconds per context token the decode kernel's longest program reads",
    "padded_tokens": "seconds per token a prefill step's graphs pad it by (to the next captured count)",
}
PADDED = FEATURES.index("padded_tokens")  # its column in a feature vector
EXTRA = ("tokens", "prefill_seqs", "max_chunk")
EXT_FEATURES = FEATURES + EXTRA


def current_name(name: str) -> str:
    """A model file's feature name as it is called today."""
    return RENAMED.get(name, name)


def current_names(coefficients: dict[str, float]) -> dict[str, float]:
    """A model file's coefficients under today's feature names."""
    return {current_name(k): v for k, v in coefficients.items()}


def step_features(spans: Iterable[Span], splits: DecodeSplits | None = None,
                  padding: StepPadding | None = None, verifying: Container[int] = ()) -> list[float]:
    """The feature vector (in ``FEATURES`` order) of one step."""
    return ext_features(spans, splits, padding, verifying)[:len(FEATURES)]


def decode_ext_features(n: int, context: int, longest: int) -> list[float]:
    """``ext_features`` of a decode-only step of ``n`` spans: ``context`` = Σ (start + 1), ``longest``
    its longest program (split or not, as the caller prices it)."""
    return [1.0, 0, 0, n, context, n, 0.0, longest, 0, n, 0, 0]


def ext_features(spans: Iterable[Span], splits: DecodeSplits | None = None,
                 padding: StepPadding | None = None, verifying: Container[int] = ()) -> list[float]:
    """The feature vector in ``EXT_FEATURES`` order (``FEATURES`` first), the decode kernel split
    by ``splits`` (None: not split), prefill steps padded by ``padding`` (None: not padded); the
    spans of the requests in ``verifying`` are verify spans."""
    pt = pa = ds = dc = ns = ps = mc = mx = 0
    for s in spans:
        n = s.num_tokens
        ns += 1
        if n == 1:
            ds += 1
            dc += s.start + 1
            if s.start >= mx:
                mx = s.start + 1
        elif s.request_id in verifying:  # 1 + d decode rows, the context read once
            ds += n
            dc += s.start + n
            if s.start + n > mx:
                mx = s.start + n
        else:
            pt += n
            ps += 1
            pa += n * s.start + n * (n + 1) // 2
            if n > mc:
                mc = n
    if splits is not None and mx:
        mx = splits.longest_program(mx, ds)
    pad = padding.padding(pt + ds) if padding is not None and pt else 0
    return [1.0, pt, pa, ds, dc, ns, 1.0 if pt else 0.0, mx, pad, pt + ds, ps, mc]
