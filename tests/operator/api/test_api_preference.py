"""spec.method and spec.preference (DPO, ORPO): their defaults, what reaches the trainer's config, and the
refusals that name the field and the fix. SFT jobs' configs are written as before."""

from __future__ import annotations

from tests.fixtures.api_specs import errors_of, spec
from tpuforge import api


def test_sft_is_the_default_and_its_config_is_written_as_before() -> None:
    s = api.validate_finetune(spec())
    assert s.method == "sft" and s.preference is None
    config = api.train_config("ns", "job", s).model_dump_json(by_alias=True)
    assert '"method"' not in config and '"preference"' not in config


def test_dpo_reaches_the_trainer_with_the_preference_defaults() -> None:
    s = api.validate_finetune(spec(method="dpo"))
    tc = api.train_config("ns", "job", s)
    again = api.TrainConfig.model_validate_json(tc.model_dump_json(by_alias=True))
    assert again.method == "dpo"
    assert again.preference == api.PreferenceSpec(beta=0.1, label_smoothing=0.0, orpo_lambda=0.1)


def test_orpo_lambda_is_written_as_lambda() -> None:
    s = api.validate_finetune(spec(method="orpo", preference={"lambda": 0.25}))
    assert s.preference is not None and s.preference.orpo_lambda == 0.25
    assert s.to_wire()["preference"]["lambda"] == 0.25
    assert api.train_config("ns", "job", s).preference == s.preference


def test_an_unknown_method_is_named_with_the_choices() -> None:
    msg = errors_of(spec(method="ppo"))["spec.method"]
    assert "dpo" in msg and "orpo" in msg


def test_preference_settings_out_of_range_are_named() -> None:
    errs = errors_of(spec(method="dpo", preference={"beta": 0, "labelSmoothing": 0.5}))
    assert set(errs) == {"spec.preference.beta", "spec.preference.labelSmoothing"}


def test_what_preference_methods_refuse_names_the_field_and_the_fix() -> None:
    errs = errors_of(spec(preference={"beta": 0.2}))
    assert "spec.method: dpo or orpo" in errs["spec.preference"]
    errs = errors_of(spec(method="dpo", training={"maxSeqLen": 64, "packing": True, "lossOn": "all"}))
    assert "packing: false" in errs["spec.training.packing"]
    assert "lossOn: assistant" in errs["spec.training.lossOn"]
    errs = errors_of(spec(method="orpo", preference={"labelSmoothing": 0.1}))
    assert "dpo only" in errs["spec.preference.labelSmoothing"]


def test_an_evaluation_of_a_preference_job_needs_its_own_records() -> None:
    raw = spec(
        method="dpo",
        dataset={"uri": "gs://d/pairs.jsonl", "evalFraction": 0.1},
        merge={"enabled": False, "writeAdapter": True},
        evaluation={"metrics": ["loss"]},
    )
    assert "spec.evaluation.datasetUri" in errors_of(raw)["spec.evaluation.datasetUri"]
    raw["evaluation"]["datasetUri"] = "gs://d/eval-chat.jsonl"
    api.validate_finetune(raw)
