"""An adapter-only FineTuneJob with an evaluation, driven through `tpuforge operator` on the sandbox's real
kube-apiserver, Job controller and garbage collector. As in test_finetunejob, the test plays the kubelet of pods
no sandbox node runs; the evaluation pod's result is the `score` container's termination message, as the
kubelet reports it. (The evaluation programs themselves run in the e2e tests.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fixtures.finetunejob import GC_WAIT, NO_NODE_POOL, Cluster, Operator, eventually
from tpuforge.api import EvalConfig
from tpuforge.api.constants import CONFIG_FILE, EXIT_BAD_CONFIG
from tpuforge.manifests.finetune_common import eval_job_name

pytestmark = pytest.mark.cluster


def adapter_job(cluster: Cluster, **evaluation: Any) -> str:
    return cluster.create(
        dataset={"uri": "gs://b/data/train.jsonl", "evalUri": "gs://b/data/eval.jsonl"},
        merge={"enabled": False, "writeAdapter": True, "nodeSelector": NO_NODE_POOL},
        evaluation={"slice": "cpu", "nodeSelector": NO_NODE_POOL, "thresholds": {"minExactMatch": 0.5}, **evaluation},
    )


def to_evaluating(cluster: Cluster, name: str) -> dict[str, Any]:
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Succeeded", exit_code=0)
    cluster.wait_phase(name, "Merging")
    cluster.wait_job(cluster.merge(name))
    cluster.set_pod(cluster.merge(name), "Succeeded", exit_code=0)
    cluster.wait_phase(name, "Evaluating")
    return cluster.wait_job(eval_job_name(name))


def _assert(ok: bool) -> None:
    assert ok


def test_adapter_only_then_evaluated_to_succeeded(cluster: Cluster, operator: Operator) -> None:
    name = adapter_job(cluster)
    eval_job = to_evaluating(cluster, name)
    out = f"gs://b/jobs/{name}/merged"
    st = cluster.status(name)
    assert st["outputs"]["adapterUri"] == f"{out}/adapter" and "mergedModelUri" not in st["outputs"]
    assert cluster.condition(name, "Merged")["reason"] == "AdapterExported"
    assert cluster.condition(name, "Evaluated")["reason"] == "Evaluating"
    assert eval_job["metadata"]["ownerReferences"][0]["name"] == name
    (config_map,) = [c for c in cluster.children("ConfigMap", name) if c["metadata"]["name"] == eval_job_name(name)]
    config = EvalConfig.model_validate_json(config_map["data"][CONFIG_FILE])
    assert (config.adapter_uri, config.report_uri) == (f"{out}/adapter", f"{out}/evaluation")

    cluster.set_pod(eval_job_name(name), "Running")
    eventually(lambda: _assert("is evaluating" in cluster.condition(name, "Evaluated")["message"]), "the pod is named")
    result = {
        "metrics": {"exactMatch": 0.75, "loss": 0.5},
        "baseMetrics": {"exactMatch": 0.0, "loss": 3.0},
        "examples": 4,
        "reportUri": f"{out}/evaluation",
    }
    cluster.set_pod(eval_job_name(name), "Succeeded", exit_code=0, message=json.dumps(result))
    st = cluster.wait_phase(name, "Succeeded")
    assert st["evaluation"] == {
        "metrics": {"exactMatch": 0.75, "loss": 0.5},
        "baseMetrics": {"exactMatch": 0.0, "loss": 3.0},
        "examples": 4,
        "run": 0,
        "passed": True,
        "result": "Passed",
        "resultDisplay": "Passed",
        "message": "exactMatch 0.75 >= minExactMatch 0.50",
        "reportUri": f"{out}/evaluation",
    }
    assert cluster.condition(name, "EvaluationPassed")["status"] == "True"
    assert ("Normal", "Evaluated", "eval passed: em 0.75 (base 0.00)") in cluster.said(name, "Evaluated")
    keys = {"namespace": cluster.ns, "name": name}
    eventually(
        lambda: _assert(
            operator.metric("tpuforge_finetunejob_eval_metric", **keys, metric="exactMatch", model="adapter") == 0.75
            and operator.metric("tpuforge_finetunejob_eval_passed", **keys) == 1
        ),
        "the evaluation's series",
    )

    # Deleting the FineTuneJob takes the evaluation Job and its pod with it (owner references).
    cluster.delete(name)
    eventually(
        lambda: _assert(all(cluster.children(k, name) == [] for k in ("Job", "Pod", "ConfigMap"))),
        "the evaluation Job, its pod and config are gone",
        GC_WAIT,
    )


def test_a_rejected_evaluation_keeps_the_outputs_and_runs_again_alone(cluster: Cluster, operator: Operator) -> None:
    name = adapter_job(cluster)
    to_evaluating(cluster, name)
    said = "dataset gs://b/data/eval.jsonl has no records"
    cluster.set_pod(eval_job_name(name), "Failed", exit_code=EXIT_BAD_CONFIG, message=said)
    st = cluster.wait_phase(name, "Succeeded")  # the training run's outputs are kept
    evaluated = cluster.condition(name, "Evaluated")
    assert evaluated["reason"] == "EvaluationFailed" and said in evaluated["message"]
    assert st["evaluation"]["result"] == "Error" and st["outputs"]["adapterUri"]
    assert ("Warning", "Evaluated", "evaluation failed, outputs kept") in cluster.said(name, "Evaluated")
    # Not retried: the evaluation Job is stopped (the apiserver of a cluster with pod failure policies, 1.26 and
    # later, fails it by itself on this exit code).
    eventually(
        lambda: _assert(
            all(
                j["metadata"].get("deletionTimestamp")
                or any(c["type"] == "Failed" for c in j["status"].get("conditions", []))
                for j in cluster.children("Job", name)
                if j["metadata"]["name"] == eval_job_name(name)
            )
        ),
        "the evaluation Job is not retried",
    )
    keys = {"namespace": cluster.ns, "name": name}
    eventually(lambda: _assert(operator.metric("tpuforge_finetunejob_eval_failed", **keys) == 1), "eval_failed is 1")

    # Fixed, and asked to run again: a Job of its own, and no training or merge Job again.
    trained = {j["metadata"]["name"] for j in cluster.children("Job", name)} - {eval_job_name(name)}
    cluster.edit(name, {"evaluation": {"rerun": 1}})
    cluster.wait_job(eval_job_name(name, 1))
    assert cluster.status(name)["phase"] in ("Evaluating", "Succeeded")
    result = {"metrics": {"exactMatch": 0.75}, "baseMetrics": {"exactMatch": 0.0}, "examples": 4}
    cluster.set_pod(eval_job_name(name, 1), "Succeeded", exit_code=0, message=json.dumps(result))
    eventually(lambda: _assert(cluster.status(name).get("evaluation", {}).get("result") == "Passed"), "passed")
    st = cluster.wait_phase(name, "Succeeded")
    assert st["evaluation"]["run"] == 1 and cluster.condition(name, "EvaluationPassed")["status"] == "True"
    jobs = {j["metadata"]["name"] for j in cluster.children("Job", name)}
    assert jobs - {eval_job_name(name), eval_job_name(name, 1)} == trained
