"""Triton kernels over the paged KV cache, each next to its torch reference.

- ``paged_attention``: decode (q_len 1) attention walking the block table; split-context variant.
- ``prefill``: causal attention of prefill chunks over cached blocks + their own span.
- ``kv_store``: write new K/V into the cache by slot mapping.
- ``launch``: ``Launch``, a step's attention prepared once for its layers (no Triton).
- ``backend``: ``TritonAttentionBackend`` (the ``triton`` attention backend).
- ``fused_norm_rope``: RMSNorm (optionally fused with the residual add before it) and rotary (q and
  k in one launch) for the model's fp16/bf16 CUDA forward.
- ``silu_and_mul``: the MLP's SiLU-and-mul in one kernel.

Nothing is imported here, so ``import runtime.executor.kernels`` costs nothing on machines without Triton.
"""
