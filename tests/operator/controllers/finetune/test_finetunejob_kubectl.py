"""What a person sees with kubectl, on the sandbox's real apiserver and the real kubectl: the printer columns
of `kubectl get finetunejobs`, and every Event the operator can post, each on one line of `kubectl describe`
at 80 columns."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetune.events import NODE, flow_events, worst_cases
from tpuforge import api
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND, FINETUNEJOB_PLURAL, GROUP, VERSION
from tpuforge.kube import events as kube_events

pytestmark = pytest.mark.cluster

SPEC = {
    "model": {"name": "gemma4-31b", "uri": "gs://b/models/gemma4-31b"},
    "dataset": {"uri": "gs://b/data/train.jsonl"},
    "training": {"maxSeqLen": 3072},
    "checkpoint": {"uri": "gs://b/run/checkpoints"},
    "output": {"uri": "gs://b/run/merged"},
    "serviceAccountName": "default",
}


def kubectl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        ["kubectl", *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def create(crd: client.CustomObjectsApi, namespace: str, name: str, status: api.FineTuneJobStatus) -> dict[str, Any]:
    body = {"apiVersion": API_VERSION, "kind": FINETUNEJOB_KIND, "metadata": {"name": name}, "spec": SPEC}
    obj = crd.create_namespaced_custom_object(GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, body)
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    crd.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, name, {"status": wire})
    return dict(obj)


def test_kubectl_get_and_describe_read_well(
    api_client: Any, namespace: str, sandbox_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    crd = client.CustomObjectsApi(api_client)
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    training = api.FineTuneJobStatus(
        phase=api.FineTunePhase.TRAINING,
        progress=api.Progress(
            step=452,
            total_steps=1000,
            percent=45.2,
            loss=1.234567,
            tokens_per_second=1043.6,
            eta_seconds=11_525,
            last_checkpoint_step=400,
            updated_at=now,
        ).displayed(),
        cost=api.Cost.estimate(1.25, 16.8),
    )
    done = api.FineTuneJobStatus(
        phase=api.FineTunePhase.SUCCEEDED,
        progress=api.Progress(
            step=1000, total_steps=1000, percent=100.0, loss=0.8123, tokens_per_second=1051.2, eta_seconds=0
        ).displayed(),
        cost=api.Cost.estimate(2.75, 16.8),
    )
    # An adapter-only job whose evaluation came out below its thresholds: it succeeded, EVAL says Failed.
    below = done.model_copy(
        update={
            "evaluation": api.EvaluationStatus(
                metrics={"exactMatch": 0.2},
                base_metrics={"exactMatch": 0.0},
                passed=False,
                result="Failed",
                result_display="Failed",
            )
        }
    )
    passed = done.model_copy(
        update={
            "evaluation": api.EvaluationStatus(
                metrics={"exactMatch": 0.9}, passed=True, result="Passed", result_display="Passed"
            )
        }
    )
    # Code run by a checker: EVAL shows pass@1 beside the verdict.
    coded = done.model_copy(
        update={
            "evaluation": api.EvaluationStatus(
                metrics={"pass@1": 0.8333, "pass@5": 1.0},
                passed=True,
                result="Passed",
                result_display="Passed (pass@1 0.83)",
            )
        }
    )
    obj = create(crd, namespace, "gemma-verilog", training)
    create(crd, namespace, "gemma-sql", done)
    create(crd, namespace, "gemma-sql-adapter", passed)
    create(crd, namespace, "gemma-sql-adapter-2", below)
    create(crd, namespace, "gemma-verilog-passk", coded)

    table = kubectl(sandbox_env, "get", "finetunejobs", "-n", namespace)
    print(table)
    lines = table.splitlines()
    header = ["NAME", "PHASE", "PROGRESS", "STEP", "LOSS", "TOK/S", "ETA", "COST", "EVAL", "SLICE", "AGE"]
    assert lines[0].split() == header
    rows = {line.split()[0]: line.split()[1:-1] for line in lines[1:]}
    assert rows["gemma-verilog"] == [
        "Training",
        "45%",
        "452",
        "1.235",
        "1043",
        "3h12m",
        "$21.00",
        "v5p-8",
    ]  # EVAL empty
    assert rows["gemma-sql"] == ["Succeeded", "100%", "1000", "0.8123", "1051", "0s", "$46.20", "v5p-8"]
    assert rows["gemma-sql-adapter"][-2:] == ["Passed", "v5p-8"]
    assert rows["gemma-sql-adapter-2"][-2:] == ["Failed", "v5p-8"]
    assert rows["gemma-verilog-passk"][-4:] == ["Passed", "(pass@1", "0.83)", "v5p-8"]

    # Every Event the controller can post, on one object: the Reason column is as wide as it gets.
    messages = [(e.type, e.reason, e.message) for e in flow_events(monkeypatch)]
    messages += [("Warning", "Preempted", m) for m in worst_cases()]
    seen = set()
    for type_, reason, message in messages:
        if (reason, message) not in seen:
            seen.add((reason, message))
            kube_events.post_event(api_client, obj, type_, reason, message)
    out = kubectl(sandbox_env, "describe", "finetunejob", "gemma-verilog", "-n", namespace)
    events = out[out.index("Events:") :].splitlines()[1:]
    print("\n".join(events))
    assert len(events) == len(seen) + 2  # the header and its underline
    too_long = [line for line in events if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    assert any(line.rstrip().endswith(NODE[-8:]) for line in events)  # a long node name keeps its end
