"""The catalog's model shapes against the libraries that run them: Tunix's own configs for the real sizes,
and transformers' models built at a tiny size in each real layout (Qwen3's untied lm_head, Gemma 4's MoE
layers), whose parameter count the catalog's formula must give. Nothing is compiled or trained here."""

from __future__ import annotations

from typing import Any

import pytest

from tpuforge.api import catalog
from tpuforge.api.catalog import HF_CONFIGS, MODELS


def test_tunix_configs_agree_with_the_catalog() -> None:
    from tunix.models.gemma4 import model as gemma4
    from tunix.models.qwen3 import model as qwen3

    for model_id, cfg in (
        ("gemma4-31b", gemma4.ModelConfig.gemma4_31b()),
        ("gemma4-26b-a4b", gemma4.ModelConfig.gemma4_26b_a4b()),
    ):
        m = MODELS[model_id]
        got = (cfg.num_layers, cfg.num_embed, cfg.embed_dim, cfg.hidden_dim, cfg.num_heads, cfg.head_dim)
        assert got == (m.num_layers, m.vocab_size, m.embed_dim, m.hidden_dim, m.num_heads, m.head_dim)
        assert (cfg.num_kv_heads, cfg.num_global_kv_heads, cfg.global_key_size, cfg.k_eq_v_global) == (
            m.num_kv_heads,
            m.num_global_kv_heads,
            m.global_head_dim,
            m.k_eq_v,
        )
        assert cfg.sliding_window_size == m.sliding_window
        assert len(cfg.attention_pattern) == m.sliding_per_global + 1
        assert (cfg.num_experts or 0, cfg.expert_dim or 0, cfg.num_experts_per_tok or 0) == (
            m.num_experts,
            m.expert_hidden_dim,
            m.experts_per_token,
        )
    q, m = qwen3.ModelConfig.qwen3_8b(), MODELS["qwen3-8b"]
    assert (q.num_layers, q.vocab_size, q.embed_dim, q.hidden_dim, q.num_heads, q.head_dim, q.num_kv_heads) == (
        m.num_layers,
        m.vocab_size,
        m.embed_dim,
        m.hidden_dim,
        m.num_heads,
        m.head_dim,
        m.num_kv_heads,
    )


def tiny(model_id: str, **fields: Any) -> dict[str, Any]:
    """The model's recorded config.json at a tiny size: the same layout, small numbers."""
    raw = HF_CONFIGS[model_id]
    text = dict(raw.get("text_config", raw))
    text.update(fields)
    text["layer_types"] = text["layer_types"][: text["num_hidden_layers"]] if "layer_types" in text else None
    text["dtype"] = "float32"
    return text


def matrices(model: Any) -> int:
    """Parameters of the weight matrices (norms, scalars and biases left out, as the catalog leaves them)."""
    return sum(p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n)


def test_the_qwen3_layout_counts_as_the_catalog_does() -> None:
    torch = pytest.importorskip("torch")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    text = tiny(
        "qwen3-8b",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        head_dim=16,
        num_key_value_heads=2,
        vocab_size=128,
    )
    text.pop("layer_types")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in text.items() if k != "architectures"}))
    shape = catalog.shape_from_config({**text, "model_type": "qwen3"})
    entry = catalog.ModelShape(id="t", lora_targets=catalog.QWEN3_LORA_TARGETS, **shape)
    assert not entry.tied_embeddings and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert matrices(model) == entry.text_params


def test_the_gemma4_moe_layout_counts_as_the_catalog_does() -> None:
    pytest.importorskip("torch")
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    text = tiny(
        "gemma4-26b-a4b",
        num_hidden_layers=6,
        hidden_size=64,
        intermediate_size=48,
        num_attention_heads=4,
        head_dim=16,
        num_key_value_heads=2,
        global_head_dim=32,
        num_global_key_value_heads=1,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=24,
        vocab_size=128,
        sliding_window=16,
        hidden_size_per_layer_input=0,
    )
    model = Gemma4ForCausalLM(Gemma4TextConfig(**{k: v for k, v in text.items() if k != "model_type"}))
    shape = catalog.shape_from_config({**text, "model_type": "gemma4_text"})
    entry = catalog.ModelShape(id="t", lora_targets=catalog.GEMMA4_LORA_TARGETS, **shape)
    assert entry.num_experts == 4 and entry.sliding_per_global == 5 and entry.k_eq_v
    counted = {n: p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n}
    assert sum(counted.values()) == entry.text_params, sorted(counted)[:40]
