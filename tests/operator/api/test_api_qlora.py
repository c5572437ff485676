"""spec.lora.baseQuantization (QLoRA): the schema's choices, what the operator refuses, and configs of jobs
without it written as before."""

from __future__ import annotations

import dataclasses

import pytest

from tests.fixtures.api_specs import errors_of, spec
from tpuforge import api
from tpuforge.api import catalog
from tpuforge.api.quantization import contracted_sizes, tile_size


def test_unset_is_none_and_leaves_the_configs_as_they_were() -> None:
    s = api.validate_finetune(spec())
    assert s.lora.base_quantization == "none"
    assert "baseQuantization" not in s.to_wire()["lora"]
    config = api.train_config("ns", "job", s).model_dump_json(by_alias=True)
    assert "baseQuantization" not in config
    assert "baseQuantization" not in api.merge_config("ns", "job", s).model_dump_json(by_alias=True)


def test_a_quantized_base_reaches_the_trainer_config() -> None:
    s = api.validate_finetune(spec(lora__baseQuantization="int8"))
    tc = api.train_config("ns", "job", s)
    assert '"baseQuantization":"int8"' in tc.model_dump_json(by_alias=True)
    assert api.TrainConfig.model_validate_json(tc.model_dump_json(by_alias=True)).lora.base_quantization == "int8"


def test_an_unknown_quantization_is_named_with_the_choices() -> None:
    errs = errors_of(spec(lora__baseQuantization="nf4"))
    assert "int8" in errs["spec.lora.baseQuantization"] and "int4" in errs["spec.lora.baseQuantization"]


@pytest.mark.parametrize("model", ["gemma4-31b", "gemma4-tiny", "qwen3-8b"])
def test_catalog_models_take_int4(model: str) -> None:
    shape = api.model_shape(model)
    sizes = contracted_sizes(shape.embed_dim, shape.hidden_dim, (shape.head_dim, shape.global_head_dim))
    assert tile_size("int4", sizes) in (128, 64, 32)
    api.validate_finetune(spec(model__name=model, lora__baseQuantization="int4"))


def test_int4_tiles_follow_the_narrowest_axis() -> None:
    assert tile_size("int4", contracted_sizes(5376, 21504, (256, 512))) == 128
    assert tile_size("int4", contracted_sizes(128, 256, (64, 128))) == 64
    assert tile_size("int8", (7,)) is None and tile_size("none", (7,)) is None


def test_int4_on_a_model_no_tile_divides_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = dataclasses.replace(api.model_shape("gemma4-tiny"), id="gemma4-odd", head_dim=48)
    monkeypatch.setitem(catalog.MODELS, odd.id, odd)
    errs = errors_of(spec(model__name=odd.id, lora__baseQuantization="int4"))
    msg = errs["spec.lora.baseQuantization"]
    assert "48" in msg and "use int8" in msg
    api.validate_finetune(spec(model__name=odd.id, lora__baseQuantization="int8"))
