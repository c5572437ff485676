"""spec.method and spec.preference (DPO, ORPO): their defaults, what reaches the trainer's config, and the
refusals that name the field and the fix. SFT jobs' configs are written as before."""

from __future__ import annotations

from typing import Any

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


def preference_eval(**overrides: Any) -> dict[str, Any]:
    """A DPO job whose evaluation asks for preferenceAccuracy (on its held-out pairs) beside the loss (on chat
    records of its own)."""
    raw = spec(
        method="dpo",
        dataset={"uri": "gs://d/pairs.jsonl", "evalFraction": 0.25},
        merge={"enabled": False, "writeAdapter": True},
        evaluation={
            "datasetUri": "gs://d/eval-chat.jsonl",
            "metrics": ["loss", "preferenceAccuracy"],
            "thresholds": {"minPreferenceAccuracy": 0.9},
        },
    )
    for key, value in overrides.items():
        raw[key] = value
    return raw


def test_preference_accuracy_is_a_metric_a_preference_job_can_gate_on() -> None:
    s = api.validate_finetune(preference_eval())
    assert s.evaluation is not None and s.evaluation.thresholds.min_preference_accuracy == 0.9
    cfg = api.eval_config("ns", "job", s)
    # Scored on the pairs the trainer held out of the training file, split by the job's data options.
    assert (cfg.pairs_uri, cfg.pairs_held_out, cfg.data.eval_fraction) == ("gs://d/pairs.jsonl", True, 0.25)
    again = api.EvalConfig.model_validate_json(cfg.model_dump_json(by_alias=True))
    assert again == cfg
    # An evalUri of pairs is scored whole.
    raw = preference_eval()
    raw["dataset"] = {"uri": "gs://d/pairs.jsonl", "evalUri": "gs://d/held-pairs.jsonl"}
    cfg = api.eval_config("ns", "job", api.validate_finetune(raw))
    assert (cfg.pairs_uri, cfg.pairs_held_out) == ("gs://d/held-pairs.jsonl", False)


def test_other_evaluations_write_their_config_as_before() -> None:
    raw = preference_eval()
    raw["evaluation"] = {"datasetUri": "gs://d/eval-chat.jsonl", "metrics": ["loss"]}
    config = api.eval_config("ns", "job", api.validate_finetune(raw)).model_dump_json(by_alias=True)
    assert "pairs" not in config


def test_preference_accuracy_refusals_name_the_field_and_the_fix() -> None:
    sft = preference_eval(method="sft")
    sft["dataset"] = {"uri": "gs://d/train.jsonl", "evalFraction": 0.25}
    assert "set spec.method: dpo or orpo" in errors_of(sft)["spec.evaluation.metrics"]
    unheld = preference_eval(dataset={"uri": "gs://d/pairs.jsonl"})
    assert (
        "spec.dataset.evalUri (a file of pairs) or spec.dataset.evalFraction"
        in errors_of(unheld)["spec.evaluation.metrics"]
    )
    unmeasured = preference_eval()
    unmeasured["evaluation"]["metrics"] = ["loss"]
    assert (
        "needs the preferenceAccuracy metric"
        in errors_of(unmeasured)["spec.evaluation.thresholds.minPreferenceAccuracy"]
    )


def test_the_verdict_holds_preference_accuracy_against_its_threshold() -> None:
    ev = api.EvaluationSpec.model_validate(
        {"metrics": ["preferenceAccuracy"], "thresholds": {"minPreferenceAccuracy": 0.9}}
    )
    assert api.evaluation_verdict(ev, {"preferenceAccuracy": 1.0, "preferenceMargin": 4.5}) == (
        True,
        "preferenceAccuracy 1.00 >= minPreferenceAccuracy 0.90",
    )
    assert api.evaluation_verdict(ev, {"preferenceAccuracy": 0.5625}) == (
        False,
        "preferenceAccuracy 0.56 < minPreferenceAccuracy 0.90",
    )
    assert api.evaluation_verdict(ev, {"loss": 0.1}) == (
        False,
        "preferenceAccuracy missing from the result (minPreferenceAccuracy 0.90)",
    )


def test_the_evaluation_pod_runs_the_forward_pass_for_preference_accuracy() -> None:
    from tpuforge.manifests.finetune_common import owner
    from tpuforge.manifests.finetune_evaluation import EVAL_LOSS_CONTAINER, eval_job

    raw = preference_eval()
    raw["evaluation"]["metrics"] = ["preferenceAccuracy"]
    raw["evaluation"]["datasetUri"] = "gs://d/eval-chat.jsonl"
    job = eval_job(owner("ml", "dpo", "uid-1"), api.validate_finetune(raw))
    pod = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == [EVAL_LOSS_CONTAINER]
    assert "--loss" in pod["containers"][0]["command"]
