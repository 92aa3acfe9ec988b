"""Loading: HF folders, errors that name the path, the architecture registry, model identity,
random shapes, rotary tables bit-identical to transformers' for every supported rope type."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.executor.model.hf_config import spec_from_hf_config
from runtime.executor.model.layers.decoder import CausalLM
from runtime.executor.model.layers.rotary import inv_freq_and_scale
from runtime.executor.model.loader import build_model, file_identity, load_model
from runtime.executor.model.registry import ARCHITECTURES, Architecture, get_architecture, register
from runtime.executor.model.spec import MODEL_SHAPES, ModelLoadError
from tests.model_helpers import TINY, make_tiny, one_thread

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def test_missing_path_names_it(tmp_path):
    with pytest.raises(ModelLoadError, match="nope"):
        load_model(str(tmp_path / "nope"), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path / "empty"), device="cpu")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="weights.bin"):
        load_model(str(tmp_path / "weights.bin"), device="cpu")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match=r"config.json: architecture 'GPT2LMHeadModel'.*not supported"):
        load_model(str(tmp_path), device="cpu")


def test_unknown_model_type_lists_the_registered_ones():
    with pytest.raises(ModelLoadError) as e:
        spec_from_hf_config({**TINY, "model_type": "gpt2"}, "x/config.json")
    assert "x/config.json" in str(e.value) and "model_type 'gpt2'" in str(e.value)
    assert str(e.value).endswith("supported model types: " + ", ".join(sorted(ARCHITECTURES)))
    assert {"llama", "qwen2", "qwen3"} <= set(ARCHITECTURES)


@pytest.mark.parametrize(("model_type", "extra", "flags"), [
    ("llama", {}, (False, False, False)),
    ("llama", {"attention_bias": True, "mlp_bias": True}, (True, True, False)),
    ("qwen2", {}, (True, False, False)),
    ("qwen3", {}, (False, False, True)),
])
def test_each_architecture_reads_its_own_fields(model_type, extra, flags):
    spec = spec_from_hf_config({**TINY, "model_type": model_type, **extra})
    assert (spec.qkv_bias, spec.mlp_bias, spec.qk_norm) == flags


def test_a_registered_architecture_is_accepted():
    """One register() call (what a models/ file does on import) is all a Llama-like type needs."""
    toy = Architecture("toy", lambda cfg: {"qk_norm": True, "mlp_bias": bool(cfg.get("toy_mlp_bias"))})
    cfg = {**TINY, "model_type": "toy", "toy_mlp_bias": True}
    with pytest.raises(ModelLoadError, match="model_type 'toy'"):
        spec_from_hf_config(cfg)
    register(toy)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register(toy)
        spec = spec_from_hf_config(cfg)
        assert (spec.model_type, spec.qkv_bias, spec.mlp_bias, spec.qk_norm) == ("toy", False, True, True)
        assert get_architecture("toy") is toy
        model = build_model(spec, 16, torch.float32, torch.device("cpu"))
        assert type(model) is CausalLM and model.layers[0].self_attn.q_norm is not None
    finally:
        del ARCHITECTURES["toy"]


def test_unsupported_rope_and_missing_field():
    base = dict(TINY, model_type="llama")
    with pytest.raises(ModelLoadError, match="rope type 'longrope'"):
        spec_from_hf_config({**base, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})
    broken = dict(base)
    del broken["hidden_size"]
    with pytest.raises(ModelLoadError, match="hidden_size"):
        spec_from_hf_config(broken, "x/config.json")


def test_folder_load_and_identity(tmp_path):
    tiny = make_tiny("qwen2", tmp_path / "m")
    again = load_model(str(tmp_path / "m"), device="cpu")
    assert tiny.loaded.identity == again.identity and tiny.loaded.identity.startswith("m@")
    assert tiny.loaded.tokenizer is None and tiny.loaded.spec.qkv_bias
    # different weights, different identity
    other = make_tiny("qwen2", tmp_path / "m2", initializer_range=0.3)
    assert other.loaded.identity.split(":")[1] != tiny.loaded.identity.split(":")[1]


def test_missing_tensor_is_reported(tmp_path):
    from safetensors.torch import load_file, save_file

    make_tiny("llama", tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="lacks 1 tensors"):
        load_model(str(tmp_path), device="cpu")


def test_file_identity_changes_with_content(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 3_000_000)
    b.write_bytes(b"x" * 2_999_999 + b"y")
    assert file_identity(a) != file_identity(b)


@pytest.mark.parametrize("shape", list(MODEL_SHAPES))
def test_random_shapes(shape):
    if shape == "qwen3-0.6b":
        pytest.skip("0.6B random init is slow on CPU; exercised by the GPU benchmark")
    loaded = load_model(f"random:{shape}", device="cpu", max_positions=64)
    assert loaded.identity == f"random:{shape}@seed0" and loaded.tokenizer is None
    assert loaded.model.embed_tokens.weight.shape[0] == MODEL_SHAPES[shape]["vocab_size"]
    with pytest.raises(ModelLoadError, match="unknown model shape"):
        load_model("random:gpt5", device="cpu")


ROPES = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128},
]


@pytest.mark.parametrize("rope", ROPES, ids=[r["rope_type"] for r in ROPES])
def test_rope_matches_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(**{**TINY, "rope_parameters": dict(rope)})
    if rope["rope_type"] == "default":
        ref, ref_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    else:
        ref, ref_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu")
    ours, scale = inv_freq_and_scale(spec_from_hf_config({**TINY, "model_type": "llama",
                                                          "rope_parameters": dict(rope)}).rope,
                                     TINY["head_dim"], TINY["max_position_embeddings"])
    assert torch.equal(ours, ref) and scale == pytest.approx(ref_scale)


def test_old_style_rope_scaling_keys():
    spec = spec_from_hf_config({**TINY, "model_type": "llama", "rope_theta": 5e5,
                                "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert spec.rope == {"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}
