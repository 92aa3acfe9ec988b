"""Reusable layers of the decoder-only models; an architecture (``models/``) picks among them.

- ``linear``: ``linear`` / ``Linear`` (F.linear with the CPU row padding)
- ``norm``: ``RMSNorm`` (fp32 HF order; ``add_forward`` fuses the residual add on the fused path)
- ``rotary``: rope tables (default, linear, llama3, yarn), ``apply_rotary``, the ``Rope`` callable
- ``attention``: ``Attention`` (fused qkv projection, optional per-head q/k norm, rope, paged KV, o_proj)
- ``mlp``: ``MLP`` (fused gate/up, SiLU-and-mul, down)
- ``decoder``: ``DecoderLayer`` and ``CausalLM``, the shared decoder-only body
- ``fused``: the Triton kernels of the fused forward, imported on first use
"""
