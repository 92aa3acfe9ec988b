"""Decoder-only models (Llama, Qwen2, Qwen3) over a flattened variable-length batch, and loaders.

- ``spec``: ``ModelSpec`` (what the forward needs), ``ModelLoadError``, real shapes for benchmarks
- ``hf_config``: config.json → ``ModelSpec`` (shared fields here, the rest by the architecture)
- ``registry``: architectures by HF ``model_type`` (``Architecture``, ``register``, ``get_architecture``)
- ``models/``: one small file per architecture, registering itself (add one there)
- ``layers/``: the reusable layers (linear, norm, rotary, attention, mlp, the fused Triton
  wrappers) and ``decoder``'s ``CausalLM``, the shared decoder-only body
- ``weights``: HF tensors → fused parameters
- ``loader``: folder / .gguf / default SmolLM2 / random shapes → ``LoadedModel``
- ``gguf``: one-time GGUF → cached HF folder conversion
"""
