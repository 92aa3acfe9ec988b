"""One small file per architecture, each registering itself by HF ``model_type``
(``registry.register``); importing this package fills the registry.

To add a Llama-like architecture: write ``models/<type>.py`` with a ``read_config(cfg)`` returning
the ModelSpec fields it sets (qkv_bias, mlp_bias, qk_norm) and ``register(Architecture("<type>",
read_config))`` (``model_class`` too if it needs a different body), then import it below. Its
checkpoint tensor names must be HF Llama's (``weights``); GGUF files go through transformers.
"""

from runtime.executor.model.models import llama, qwen2, qwen3  # noqa: F401  (each registers itself)
