"""spec.model.fineTuneJobRef on a FineTuneJob: the other job's merged model resolved (missing, running, failed,
succeeded, another architecture), waited for while Pending, kept in status.model and carried into every pod's
config as the base model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures.finetune.world import NAME, World, raw_spec, train
from tpuforge import api
from tpuforge.api import finetune_reasons as c
from tpuforge.api.constants import CONFIG_FILE
from tpuforge.controllers.finetune import starting_model
from tpuforge.controllers.finetune.events import NO_MODEL_YET
from tpuforge.manifests.finetune_common import merge_job_name, owner
from tpuforge.manifests.preflight import preflight_config_map

SFT = "gemma-sft"
MERGED = "gs://b/jobs/gemma-sft/merged"


def sft_job(phase: str | None, merged: str | None = MERGED, model: str = "gemma4-31b") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if merged:
        status["outputs"] = {"mergedModelUri": merged}
    return {"metadata": {"name": SFT, "uid": "uid-sft"}, "spec": {"model": {"name": model}}, "status": status}


def dpo_spec() -> dict[str, Any]:
    return raw_spec(model={"name": "gemma4-31b", "fineTuneJobRef": {"name": SFT}}, method="dpo")


def test_a_missing_job_is_waited_for_by_name() -> None:
    found = starting_model.resolve(SFT, "gemma4-31b", None)
    assert found.uri is None and not found.final
    assert found.reason == c.WAITING_FOR_MODEL and repr(SFT) in found.message and "does not exist" in found.message


@pytest.mark.parametrize("phase", [None, "Pending", "Training", "Merging", "Evaluating"])
def test_a_job_not_yet_succeeded_is_waited_for_with_its_phase(phase: str | None) -> None:
    found = starting_model.resolve(SFT, "gemma4-31b", sft_job(phase, merged=None))
    assert found.uri is None and not found.final and found.reason == c.WAITING_FOR_MODEL
    assert f"now {phase or 'not started'}" in found.message


def test_a_failed_job_gives_no_model_ever() -> None:
    found = starting_model.resolve(SFT, "gemma4-31b", sft_job("Failed", merged=None))
    assert found.uri is None and found.final and found.reason == c.MODEL_JOB_FAILED and repr(SFT) in found.message


def test_a_job_that_succeeded_without_merging_gives_no_model() -> None:
    found = starting_model.resolve(SFT, "gemma4-31b", sft_job("Succeeded", merged=None))
    assert found.final and found.reason == c.NO_MERGED_MODEL and "merge.enabled" in found.message


def test_a_succeeded_job_gives_its_merged_model() -> None:
    assert starting_model.resolve(SFT, "gemma4-31b", sft_job("Succeeded")).uri == MERGED


def test_a_job_of_another_model_is_refused_naming_both_fields() -> None:
    found = starting_model.resolve(SFT, "gemma4-31b", sft_job("Succeeded", model="qwen3-8b"))
    assert found.uri is None and found.final and found.reason == c.MODEL_MISMATCH
    assert "spec.model.name is 'gemma4-31b'" in found.message and "'qwen3-8b'" in found.message


def test_the_pods_configs_read_the_resolved_model() -> None:
    spec = starting_model.located(api.parse(api.FineTuneJobSpec, dpo_spec()), MERGED)
    assert api.train_config("team-a", "dpo", spec).model_uri == MERGED
    assert api.merge_config("team-a", "dpo", spec).base_model_uri == MERGED
    assert spec.to_wire()["model"] == {"name": "gemma4-31b", "fineTuneJobRef": {"name": SFT}}


def test_the_preflight_and_the_evaluation_read_the_resolved_model() -> None:
    raw = dpo_spec() | {"evaluation": {"datasetUri": "gs://b/data/eval.jsonl"}}
    spec = starting_model.located(api.parse(api.FineTuneJobSpec, raw), MERGED)
    preflight = preflight_config_map(owner("team-a", "dpo", "uid-1"), spec)
    assert json.loads(preflight["data"][CONFIG_FILE])["modelUri"] == MERGED
    assert api.eval_config("team-a", "dpo", spec).base_model_uri == MERGED


def test_an_unresolved_reference_renders_no_config() -> None:
    with pytest.raises(ValueError, match="not resolved yet"):
        api.train_config("team-a", "dpo", api.parse(api.FineTuneJobSpec, dpo_spec()))


def test_the_job_waits_pending_then_trains_from_the_merged_model_kept_in_status() -> None:
    w = World(dpo_spec())
    p = w.step()
    assert p.create == [] and w.phase() == api.FineTunePhase.PENDING
    waiting = w.condition(c.TRAINING)
    assert (waiting.status, waiting.reason) == ("False", c.WAITING_FOR_MODEL) and "does not exist" in waiting.message
    assert w.reasons() == [NO_MODEL_YET]
    w.model_job = sft_job("Training", merged=None)
    w.step()
    assert "now Training" in w.condition(c.TRAINING).message and w.reasons() == [NO_MODEL_YET]
    w.model_job = sft_job("Succeeded")
    p = w.step()
    assert w.status.model == api.ModelStatus(fine_tune_job=SFT, uri=MERGED)
    config = next(o for o in p.create if o["kind"] == "ConfigMap")
    assert json.loads(config["data"][CONFIG_FILE])["modelUri"] == MERGED
    # Later stages read status.model, whatever became of the other job.
    w.model_job = None
    w.pod(train(0), "Succeeded", exit_code=0)
    p = w.step()
    assert w.phase() == api.FineTunePhase.MERGING
    merge = next(o for o in p.create if o["kind"] == "ConfigMap" and o["metadata"]["name"] == merge_job_name(NAME))
    assert MERGED in json.dumps(merge["data"])


def test_the_job_fails_naming_the_failed_job() -> None:
    w = World(dpo_spec())
    w.model_job = sft_job("Failed", merged=None)
    p = w.step()
    assert p.create == [] and w.phase() == api.FineTunePhase.FAILED
    failed = w.condition(c.FAILED)
    assert failed.reason == c.MODEL_JOB_FAILED and repr(SFT) in failed.message
