"""The model catalog: each real model's entry is what its recorded config.json says, its size is the published
one, it trains on the cheapest slice that holds it, and a stage it lacks is refused with the field and why."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tpuforge import api
from tpuforge.api import catalog
from tpuforge.api.catalog import HF_CONFIGS, MODELS, TPU_SLICES
from tpuforge.api.serving_validation import check_serving
from tpuforge.api.validation import check_finetune

REAL = sorted(m.id for m in MODELS.values() if m.hf_repo)
# Text-model parameters as the model cards state them (Gemma 4: 30.7B and 25.2B; Qwen3-8B: 8.2B).
PUBLISHED_PARAMS = {"gemma4-31b": 30.7e9, "gemma4-26b-a4b": 25.2e9, "qwen3-8b": 8.2e9}


def test_every_real_model_has_its_config_recorded() -> None:
    assert sorted(HF_CONFIGS) == REAL
    assert set(PUBLISHED_PARAMS) == set(REAL)


@pytest.mark.parametrize("model_id", REAL)
def test_the_entry_is_the_shape_its_config_json_gives(model_id: str) -> None:
    entry = MODELS[model_id]
    derived = catalog.shape_from_config(HF_CONFIGS[model_id])
    assert dataclasses.replace(entry, **derived) == entry, {
        k: (v, getattr(entry, k)) for k, v in derived.items() if getattr(entry, k) != v
    }


@pytest.mark.parametrize("model_id", REAL)
def test_the_shape_counts_the_published_parameters(model_id: str) -> None:
    assert MODELS[model_id].text_params == pytest.approx(PUBLISHED_PARAMS[model_id], rel=0.005)


def test_a_config_of_another_family_or_layer_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="model_type 'llama'"):
        catalog.shape_from_config({**HF_CONFIGS["qwen3-8b"], "model_type": "llama"})
    text = dict(HF_CONFIGS["gemma4-31b"]["text_config"])
    text["layer_types"] = ["sliding_attention", "full_attention", "full_attention"] * 20
    with pytest.raises(ValueError, match="layer_types"):
        catalog.shape_from_config({"model_type": "gemma4", "text_config": text})


@pytest.mark.parametrize("model_id", REAL)
def test_the_recorded_train_slice_is_the_cheapest_that_holds_the_model(model_id: str) -> None:
    model = MODELS[model_id]
    assert model.train_slice == catalog.training_slices(model)[0].id
    slc = TPU_SLICES[model.train_slice]
    # A mesh suits the model when tp divides every head count and stays within one host.
    heads = (model.num_heads, model.num_kv_heads, model.num_global_kv_heads)
    tps = [tp for tp in range(1, slc.chips_per_host + 1) if slc.chips % tp == 0 and all(h % tp == 0 for h in heads)]
    # The slice's default tp=4 suits all but the 26B-A4B, whose 2 global kv heads need spec.tpu.mesh tp=2.
    assert max(tps) == (2 if model_id == "gemma4-26b-a4b" else slc.default_tp)


def test_slices_are_picked_by_size() -> None:
    fits = {m: [s.id for s in catalog.training_slices(MODELS[m])] for m in REAL}
    # The 31B's 61 GB of weights fill 14.6 GiB of each v6e-4 chip's 32: too much; a v5p-8 (the source report's),
    # a v5e 4x4 (3.6 GiB of each chip's 16) or a v6e-8 hold them.
    assert "v6e-4" not in fits["gemma4-31b"] and fits["gemma4-31b"][:3] == ["v5p-8", "v5litepod-16", "v6e-8"]
    # The MoE model is nearly as large on the chips as the 31B, though it computes far less.
    assert "v6e-4" not in fits["gemma4-26b-a4b"] and fits["gemma4-26b-a4b"][0] == "v5p-8"
    # Qwen3-8B's 16 GB fit the cheapest slice, a v5e 2x2 (3.8 GiB of each chip's 16); not one v5e chip.
    assert fits["qwen3-8b"][0] == "v5litepod-4" and "v5litepod-1" not in fits["qwen3-8b"]
    # Every slice large enough for the 31B holds the smaller models too.
    for smaller in ("gemma4-26b-a4b", "qwen3-8b"):
        assert set(fits["gemma4-31b"]) <= set(fits[smaller])


def test_training_cost_counts_a_moe_model_s_active_parameters() -> None:
    v5p8 = TPU_SLICES["v5p-8"]
    usd = {m: catalog.training_hours_usd(MODELS[m], v5p8, tokens=10**9, mfu=0.08) for m in REAL}
    # 6N FLOPs per token: the 26B-A4B's ~3.8B active parameters cost about an eighth of the 31B's 30.7B.
    assert usd["gemma4-26b-a4b"] == pytest.approx(usd["gemma4-31b"] * 3.8 / 30.7, rel=0.05)
    assert usd["qwen3-8b"] == pytest.approx(usd["gemma4-31b"] * 8.19 / 30.7, rel=0.01)
    # 6 x 30.7e9 x 1e9 FLOPs at 8% of 4 x 459 TFLOP/s is 349 h of a $16.80/h slice.
    assert usd["gemma4-31b"] == pytest.approx(6 * 30.7e9 * 1e9 / (4 * 459e12 * 0.08) / 3600 * 16.80, rel=0.01)


def finetune(model: str, slice_id: str) -> Any:
    return api.FineTuneJobSpec.model_validate(
        {
            "model": {"name": model, "uri": "gs://m/base"},
            "dataset": {"uri": "gs://d/train.jsonl"},
            "training": {"maxSeqLen": 4096},
            "tpu": {"slice": slice_id},
            "checkpoint": {"uri": "gs://r/checkpoints"},
            "output": {"uri": "gs://r/merged"},
            "serviceAccountName": "trainer",
        }
    )


def test_a_model_not_yet_fine_tuned_is_refused_by_name_with_the_reason() -> None:
    model_id = "gemma4-26b-a4b"
    model = MODELS[model_id]
    # Only the model is named: its mesh and LoRA targets (Gemma 4's by default) are moot until it trains.
    errors = check_finetune(finetune(model_id, model.train_slice))
    assert [e.field for e in errors] == ["spec.model.name"]
    message = errors[0].message
    assert "fine-tuning (FineTuneJob) is not supported" in message and model.unsupported_because in message
    assert "use one of ['gemma4-31b', 'gemma4-tiny', 'gemma4-tiny-mm', 'qwen3-8b', 'qwen3-tiny']" in message


def test_the_31b_on_its_train_slice_is_accepted() -> None:
    assert check_finetune(finetune("gemma4-31b", MODELS["gemma4-31b"].train_slice)) == []


def test_a_model_not_yet_served_is_refused_by_name() -> None:
    spec = api.ServingDeploymentSpec.model_validate(
        {"model": {"uri": "gs://m/base", "name": "gemma4-26b-a4b"}, "tpu": {"slice": "v6e-8"}}
    )
    errors = [e for e in check_serving(spec) if e.field == "spec.model.name"]
    assert len(errors) == 1 and "serving (ServingDeployment) is not supported" in errors[0].message
