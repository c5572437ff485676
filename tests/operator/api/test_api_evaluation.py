"""spec.evaluation: the validation rules (each naming its field and the fix), the EvalConfig the pod reads, the
merge's adapter-only config, and the verdict against the thresholds."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.api_specs import errors_of, spec, with_eval
from tpuforge import api
from tpuforge.api.configs import evaluation_mesh


def test_an_adapter_only_job_with_an_evaluation_is_valid_with_the_defaults() -> None:
    s = api.validate_finetune(with_eval())
    assert s.evaluation is not None
    assert (s.evaluation.metrics, s.evaluation.slice, s.evaluation.max_examples) == (
        ["loss", "exactMatch"],
        "v6e-8",
        200,
    )


@pytest.mark.parametrize("enabled", [True, False])
def test_an_evaluation_needs_the_exported_adapter(enabled: bool) -> None:
    errors = errors_of(with_eval(merge={"enabled": enabled, "writeAdapter": False}))
    assert list(errors) == ["spec.merge.writeAdapter"]
    message = errors["spec.merge.writeAdapter"]
    assert "serves the exported adapter with vLLM" in message and "set spec.merge.writeAdapter: true" in message
    assert f"spec.merge.enabled: {str(enabled).lower()}" in message


def test_an_evaluation_needs_a_dataset_and_names_both_places_for_it() -> None:
    raw = with_eval(dataset={"uri": "gs://d/train.jsonl"})
    message = errors_of(raw)["spec.evaluation.datasetUri"]
    assert "spec.evaluation.datasetUri" in message and "spec.dataset.evalUri" in message
    raw["evaluation"]["datasetUri"] = "gs://d/held-out.jsonl"
    assert api.validate_finetune(raw).evaluation is not None


def test_the_evaluation_dataset_must_be_on_gcs_outside_the_sandbox() -> None:
    errors = errors_of(with_eval({"datasetUri": "/data/eval.jsonl"}))
    assert "only the sandbox's pods" in errors["spec.evaluation.datasetUri"]
    assert "gs://" in errors["spec.evaluation.datasetUri"]
    errors = errors_of(with_eval({"datasetUri": "s3://data/eval.jsonl"}))
    assert "must be a gs:// URI" in errors["spec.evaluation.datasetUri"]


@pytest.mark.parametrize(
    ("threshold", "value", "metrics", "missing"),
    [("maxLoss", 1.0, ["exactMatch"], "loss"), ("minExactMatch", 0.5, ["loss"], "exactMatch")],
)
def test_a_threshold_needs_its_metric(threshold: str, value: float, metrics: list[str], missing: str) -> None:
    errors = errors_of(with_eval({"metrics": metrics, "thresholds": {threshold: value}}))
    message = errors[f"spec.evaluation.thresholds.{threshold}"]
    assert f"add {missing} to spec.evaluation.metrics" in message


@pytest.mark.parametrize(
    ("slice_id", "said"), [("v5p-16", "spans 2 hosts"), ("v7x-8", "unknown slice"), ("CPU", "unknown slice")]
)
def test_the_evaluation_slice_is_cpu_or_one_host(slice_id: str, said: str) -> None:
    message = errors_of(with_eval({"slice": slice_id}))["spec.evaluation.slice"]
    assert (
        said in message
        and "use cpu or one of ['v5litepod-1', 'v5litepod-4', 'v5litepod-8', 'v5p-8', 'v6e-4', 'v6e-8']" in message
    )


@pytest.mark.parametrize("slice_id", ["cpu", "v5p-8", "v6e-4", "v6e-8"])
def test_every_single_host_slice_and_cpu_can_evaluate(slice_id: str) -> None:
    assert api.validate_finetune(with_eval({"slice": slice_id})).evaluation is not None


def test_eval_config_points_at_the_adapter_the_checkpoints_and_the_report() -> None:
    s = api.validate_finetune(
        with_eval({"metrics": ["exactMatch"], "maxExamples": 50, "maxNewTokens": 32}, output={"uri": "gs://r/job/out/"})
    )
    c = api.eval_config("ns", "job", s)
    assert c.job == api.JobRef(namespace="ns", name="job")
    assert (c.model_name, c.base_model_uri, c.checkpoint_uri) == (
        "gemma4-31b",
        "gs://m/gemma",
        "gs://r/job/checkpoints",
    )
    assert (c.adapter_uri, c.report_uri) == ("gs://r/job/out/adapter", "gs://r/job/out/evaluation")
    assert c.adapter_uri == api.adapter_uri(s)
    assert (c.dataset_uri, c.metrics, c.max_examples, c.max_new_tokens) == ("gs://d/eval.jsonl", ["exactMatch"], 50, 32)
    assert c.lora == s.lora and c.training == s.training
    assert c.mesh == api.MeshSpec(fsdp=2, tp=4)  # v6e-8's catalog default
    assert api.EvalConfig.model_validate_json(c.model_dump_json(by_alias=True)) == c
    own = api.eval_config("ns", "job", api.validate_finetune(with_eval({"datasetUri": "gs://d/own.jsonl"})))
    assert own.dataset_uri == "gs://d/own.jsonl"


def test_the_loss_mesh_is_the_slices_default_or_one_cpu_device() -> None:
    assert evaluation_mesh("cpu") == api.MeshSpec(fsdp=1, tp=1)
    for slice_id in ("v5p-8", "v6e-4", "v6e-8"):
        s = api.tpu_slice(slice_id)
        assert evaluation_mesh(slice_id) == api.MeshSpec(fsdp=s.default_fsdp, tp=s.default_tp)


def test_eval_config_needs_an_evaluation() -> None:
    with pytest.raises(ValueError, match=r"spec\.evaluation is unset"):
        api.eval_config("ns", "job", api.validate_finetune(spec()))


@pytest.mark.parametrize(
    ("merge", "merged", "adapter"),
    [({}, True, False), ({"writeAdapter": True}, True, True), ({"enabled": False, "writeAdapter": True}, False, True)],
)
def test_the_merge_config_writes_what_the_spec_asks_for(merge: dict[str, Any], merged: bool, adapter: bool) -> None:
    c = api.merge_config("ns", "job", api.validate_finetune(spec(merge=merge)))
    assert (c.write_merged, c.write_adapter) == (merged, adapter)


def thresholds(**t: float) -> api.EvaluationSpec:
    return api.EvaluationSpec.model_validate({"thresholds": t})


def test_the_verdict_names_each_threshold_and_the_value_it_was_held_to() -> None:
    both = thresholds(maxLoss=0.5, minExactMatch=0.5)
    assert api.evaluation_verdict(both, {"loss": 0.25, "exactMatch": 0.75}) == (
        True,
        "loss 0.25 <= maxLoss 0.5; exactMatch 0.75 >= minExactMatch 0.50",
    )
    assert api.evaluation_verdict(both, {"loss": 0.25, "exactMatch": 0.2}) == (
        False,
        "exactMatch 0.20 < minExactMatch 0.50; loss 0.25 <= maxLoss 0.5",
    )
    assert api.evaluation_verdict(both, {"loss": 0.6, "exactMatch": 0.2}) == (
        False,
        "loss 0.6 > maxLoss 0.5; exactMatch 0.20 < minExactMatch 0.50",
    )


def test_a_threshold_is_met_at_equality_and_missing_metrics_fail() -> None:
    assert api.evaluation_verdict(thresholds(maxLoss=0.5, minExactMatch=0.5), {"loss": 0.5, "exactMatch": 0.5})[0]
    passed, message = api.evaluation_verdict(thresholds(minExactMatch=0.5), {"loss": 0.1})
    assert not passed and message == "exactMatch missing from the result (minExactMatch 0.50)"


def test_no_thresholds_always_pass() -> None:
    passed, message = api.evaluation_verdict(api.EvaluationSpec(), {"loss": 9.0, "exactMatch": 0.0})
    assert passed and "no thresholds set" in message
