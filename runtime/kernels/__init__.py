"""Triton kernels over the paged KV cache, each next to its torch reference.

- ``paged_attention``: decode (q_len 1) attention walking the block table; split-context variant.
- ``prefill``: causal attention of prefill chunks over cached blocks + their own span.
- ``kv_store``: write new K/V into the cache by slot mapping.
- ``backend``: ``TritonAttentionBackend`` (the ``triton`` attention backend).

Nothing is imported here, so ``import runtime.kernels`` costs nothing on machines without Triton.
"""
