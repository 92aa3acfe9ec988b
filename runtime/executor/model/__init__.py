"""Llama-family models (Llama, Qwen2, Qwen3) over a flattened variable-length batch, and loaders.

- ``spec``: ModelSpec parsed from an HF config.json; ``ModelLoadError``; real shapes for benchmarks
- ``rope``: rotary tables (default, linear, llama3, yarn)
- ``llama``: the forward (``CausalLM``)
- ``weights``: HF tensors → fused parameters
- ``loader``: folder / .gguf / default SmolLM2 / random shapes → ``LoadedModel``
- ``gguf``: one-time GGUF → cached HF folder conversion
"""
