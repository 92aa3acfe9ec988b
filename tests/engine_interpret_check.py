"""Run under TRITON_INTERPRET=1 (by tests/test_model_triton_interpret.py): the whole engine on a
tiny Llama with the Triton attention backend on the CPU, compared token for token with HF.
Prints one JSON line: {scenario: "ok" | error}."""

from __future__ import annotations

import json
import random
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    import runtime.executor.model_runner as mr
    from runtime.executor.attention.triton_backend import TritonAttentionBackend
    from tests.model_helpers import make_tiny, run_engine

    torch.set_num_threads(1)
    rng = random.Random(0)
    tiny = make_tiny("qwen3", Path(tempfile.mkdtemp()))
    scenarios = {
        "mixed_batch": ([rng.randrange(320) for _ in range(n)] for n in (1, 17, 6)),
        "chunked_prefill": ([rng.randrange(320) for _ in range(n)] for n in (30, 9)),
    }
    shared = [rng.randrange(320) for _ in range(13)]
    scenarios["prefix_hits"] = [shared + [1, 2], shared + [3]]
    results = {}
    real_init = mr.ModelRunner.__init__

    def with_triton(self, *a, **kw):
        real_init(self, *a, backend=TritonAttentionBackend("cpu"), **kw)

    mr.ModelRunner.__init__ = with_triton
    scenarios["decode_graph_buffers"] = [[rng.randrange(320) for _ in range(n)] for n in (3, 20, 9, 1, 33)]
    for name, prompts in scenarios.items():
        prompts = list(prompts)
        try:
            kw = {"chunked_prefill": {"max_num_batched_tokens": 12}, "prefix_hits": {"staggered": True}}.get(name, {})
            run = run_engine(tiny.loaded, prompts, 5, **kw)
            if name == "decode_graph_buffers":  # the CUDA-graph staging/padding path, run eagerly
                from runtime.executor.cuda_graphs import DecodeGraphs

                def with_graphs(self, *a, **kw):
                    with_triton(self, *a, **kw)
                    self.graphs = DecodeGraphs(self.model, self.kv_caches, self.backend, max_batch=8,
                                               max_model_len=600, block_size=self.block_size, device=self.device)
                    self.graphs.capture()

                mr.ModelRunner.__init__ = with_graphs
                run = run_engine(tiny.loaded, prompts, 5, **kw)
                assert run.runner.graphs.replays > 0
                overlapped = run_engine(tiny.loaded, prompts, 5, overlap=True, **kw)  # placeholders filled
                mr.ModelRunner.__init__ = with_triton
                assert overlapped.outputs == run.outputs
            if name == "prefix_hits":
                assert run.cached_tokens >= 12
            for p, out in zip(prompts, run.outputs):
                assert out == tiny.reference(p, 5), (out, tiny.reference(p, 5))
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - reported to the parent test
            results[name] = traceback.format_exc(limit=6)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
