"""Which adapters vLLM would apply otherwise than HF: k_proj factors without v_proj ones on a Gemma 4 layer
whose values are its keys (attention_k_eq_v full-attention layers that project keys)."""

from __future__ import annotations

from typing import Any

from tpuforge_workloads.model.adapters import keys_as_values_layers, values_without_lora

LAYER_TYPES = ["sliding_attention", "full_attention"] * 3


def text(**kw: Any) -> dict[str, Any]:
    return {"attention_k_eq_v": True, "layer_types": LAYER_TYPES, "num_kv_shared_layers": 0} | kw


def factors(prefix: str, layer: int, *projs: str) -> list[str]:
    return [f"base_model.model.{prefix}layers.{layer}.self_attn.{p}.lora_{f}.weight" for p in projs for f in "AB"]


def test_keys_are_values_on_global_layers_that_project_keys() -> None:
    assert keys_as_values_layers(text()) == {1, 3, 5}
    assert keys_as_values_layers(text(num_kv_shared_layers=2)) == {1, 3}  # layers 4, 5 reuse earlier keys
    assert keys_as_values_layers(text(attention_k_eq_v=False)) == set()
    assert keys_as_values_layers({"text_config": text()}) == {1, 3, 5}  # the multimodal checkpoint


def test_k_proj_without_v_proj_on_those_layers_is_found() -> None:
    names = factors("model.", 0, "k_proj") + factors("model.", 1, "k_proj") + factors("model.", 3, "k_proj", "v_proj")
    names += factors("model.", 5, "q_proj", "o_proj")
    assert values_without_lora(names, text()) == [1]
    assert values_without_lora(names, text(attention_k_eq_v=False)) == []
    multimodal = factors("model.language_model.", 3, "k_proj") + factors("model.vision_tower.encoder.", 3, "k_proj")
    assert values_without_lora(multimodal, {"text_config": text()}) == [3]
