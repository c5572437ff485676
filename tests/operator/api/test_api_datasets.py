"""spec.dataset: formats, local paths (sandbox only), the held-out split and how the configs carry it."""

from __future__ import annotations

from typing import Any

import pytest

from tpuforge import api
from tpuforge.api import DataOptions, SpecError
from tpuforge.controllers.main import parser


def spec(dataset: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "model": {"name": "gemma4-tiny", "uri": "gs://m/gemma4-tiny"},
        "dataset": dataset,
        "training": {"maxSeqLen": 64, "warmupSteps": 0},
        "tpu": {"slice": "v5p-8"},
        "checkpoint": {"uri": "gs://r/ck"},
        "output": {"uri": "gs://r/out"},
        "serviceAccountName": "trainer",
        **more,
    }


def errors_of(raw: dict[str, Any], local_paths: bool = False) -> dict[str, str]:
    try:
        api.validate_finetune(raw, local_paths)
    except SpecError as e:
        return {x.field: x.message for x in e.errors}
    return {}


@pytest.mark.parametrize("uri", ["/data/train.jsonl", "file:///data/train.parquet"])
def test_a_local_dataset_path_is_refused_on_a_cluster_and_accepted_in_the_sandbox(uri: str) -> None:
    raw = spec({"uri": uri})
    message = errors_of(raw)["spec.dataset.uri"]
    assert "only the sandbox's pods" in message and "gs://" in message
    assert errors_of(raw, local_paths=True) == {}


def test_a_relative_file_uri_is_refused_even_in_the_sandbox() -> None:
    assert "must be absolute" in errors_of(spec({"uri": "file://data/train.jsonl"}), True)["spec.dataset.uri"]


def test_an_eval_file_and_an_eval_fraction_are_one_too_many() -> None:
    raw = spec({"uri": "gs://d/t.jsonl", "evalUri": "gs://d/e.jsonl", "evalFraction": 0.1})
    assert "set one of them" in errors_of(raw)["spec.dataset.evalFraction"]


def test_the_data_options_reach_the_trainer_and_the_evaluation_reads_the_held_out_records() -> None:
    dataset = {"uri": "gs://d/t.parquet", "evalFraction": 0.05, "splitSeed": 9, "keepThinking": True}
    raw = spec(
        dataset,
        merge={"writeAdapter": True},
        evaluation={"slice": "cpu", "metrics": ["loss"]},
    )
    s = api.validate_finetune(raw)
    options = DataOptions(eval_fraction=0.05, split_seed=9, keep_thinking=True)
    assert api.train_config("ns", "job", s).data == options
    e = api.eval_config("ns", "job", s)
    assert (e.dataset_uri, e.held_out, e.data) == ("gs://d/t.parquet", True, options)
    # An evaluation file of its own is read whole.
    s = api.validate_finetune({**raw, "evaluation": {**raw["evaluation"], "datasetUri": "gs://d/e.jsonl"}})
    assert (api.eval_config("ns", "job", s).dataset_uri, api.eval_config("ns", "job", s).held_out) == (
        "gs://d/e.jsonl",
        False,
    )


def test_the_defaults_read_every_dataset_as_before() -> None:
    d = api.validate_finetune(spec({"uri": "gs://d/t.jsonl"})).dataset
    assert (
        d.options()
        == DataOptions()
        == DataOptions(format=None, eval_fraction=0.0, split_seed=0, keep_thinking=False, skip_invalid=False)
    )


def test_local_dataset_paths_are_an_operator_flag_off_by_default() -> None:
    assert not parser().parse_args([]).local_dataset_paths
    assert parser().parse_args(["--local-dataset-paths"]).local_dataset_paths
