"""The whole FineTuneJob pipeline on the sandbox with real pods: `tpuforge operator` as a process, the node
agent running the trainer (JAX on 4 virtual CPU devices per emulated v5p-8 host) and the merge as local
processes, models and checkpoints in fake GCS.

The first job runs its preflight (a CPU pod compiling its step for the v5p-8's TPU topology) before training,
as every job does by default; the others skip it. Runs are tiny (steps of 2 packed rows of 64 tokens) and
share one tiny model and dataset in GCS, and the training pods share a persistent XLA compilation cache, so
each program compiles once per session.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.finetunejob import Cluster
from tests.fixtures.models import read_summary
from tests.fixtures.pipelines import JOB_TIMEOUT, STEPS, TRAINER, finish, pod_logs, steps_logged, wait_for_log
from tpuforge.api.constants import LABEL_COMPONENT
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_merge import MERGER_CONTAINER
from tpuforge.manifests.preflight import COMPONENT_PREFLIGHT
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_workloads.storage import commit

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]


def trainer_pod(cluster: Cluster, name: str, attempt: int) -> dict[str, Any]:
    """The attempt's training pod once it runs on a node."""

    def running() -> dict[str, Any] | None:
        pods = kube_objects.list_objects(
            cluster.api, "v1", "Pod", cluster.ns, f"job-name={cluster.train(name, attempt)}"
        )
        return next((p for p in pods if (p.get("status") or {}).get("phase") == "Running"), None)

    pod: dict[str, Any] = wait_for(
        running, JOB_TIMEOUT, f"the training pod of attempt {attempt} of {name}", interval=0.2
    )
    return pod


def preflight_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    pods = cluster.children("Pod", name)
    return [p for p in pods if p["metadata"]["labels"].get(LABEL_COMPONENT) == COMPONENT_PREFLIGHT]


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = pod["status"]["containerStatuses"][0]["state"]
    return dict(state["terminated"])


def test_a_finetunejob_trains_merges_and_succeeds_with_a_complete_verified_model(
    cluster: Cluster, sandbox: Sandbox, job_spec: Any
) -> None:
    # The job as a user gets it: its preflight first (the other e2e jobs skip it).
    spec = job_spec("pipeline", every=50, merge=True, preflight={"enabled": True})
    name = cluster.create("pipeline", **spec)
    status = finish(cluster, sandbox, name)
    assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, name)}"

    # The preflight compiled the step for the v5p-8's real topology on the CPU node, before any TPU pod.
    pf = status["preflight"]
    assert pf["fits"] is True and pf["slice"] == "v5p-8" and pf["topology"] == "v5p:2x2x1"
    assert 0 < pf["hbmPerChipGiB"] < pf["hbmCapacityGiB"] == 95.74
    assert pf["tflopsPerStep"] > 0 and pf["estimatedTokensPerSecond"] > 0
    assert pf["estimatedSeconds"] > 0 and pf["estimatedUSD"] > 0 and pf["compileSeconds"] > 0
    assert pf["message"].startswith("fits: ")
    cond = cluster.condition(name, "Preflight")
    assert cond["status"] == "True" and cond["reason"] == "Fits"
    preflight = preflight_pods(cluster, name)
    assert len(preflight) == 1 and preflight[0]["spec"]["nodeName"] == "cpu-0"
    finished_at = terminated(preflight[0])["finishedAt"]
    assert status["attempts"][0]["startTime"] >= finished_at

    out = spec["output"]["uri"]
    assert status["outputs"] == {"checkpointUri": spec["checkpoint"]["uri"], "mergedModelUri": out}
    assert status["restarts"] == {"failures": 0, "preemptions": 0}
    assert (status["progress"]["step"], status["progress"]["totalSteps"]) == (STEPS, STEPS)
    assert [a["outcome"] for a in status["attempts"]] == ["Succeeded"]
    # Complete: the _COMPLETE manifest lists every file of the output, and each one matches its size and sha256.
    manifest = commit.require_complete(out, checksums=True)
    assert {"config.json", "tokenizer.json", "model.safetensors.index.json"} <= manifest.names()
    assert any(n.startswith("model-00001-of-") for n in manifest.names())  # sharded (shardSizeMB: 1)
    assert manifest.metadata["step"] == STEPS and manifest.metadata["checkpointUri"] == spec["checkpoint"]["uri"]
    # Verified: the merge pod reloaded the output with transformers and matched the JAX LoRA model's logits.
    merge_pods = cluster.children("Pod", name)
    merge_pod = next(p for p in merge_pods if p["metadata"]["labels"].get("job-name") == cluster.merge(name))
    assert merge_pod["status"]["phase"] == "Succeeded"
    merge_log = sandbox.pod_log(cluster.ns, merge_pod["metadata"]["name"], MERGER_CONTAINER).read_text()
    assert re.search(r"verify passed: max \|logit diff\| \S+", merge_log), merge_log[-2000:]
    # Event times have whole seconds: Created and Training often share one.
    said = cluster.said(name, "Preflight", "Created", "Training", "Merging", "Succeeded")
    assert any(reason == "Preflight" and text.startswith("fits") for _, reason, text in said), said
    reasons = [reason for _, reason, _ in said]
    assert reasons.index("Training") < reasons.index("Merging") < reasons.index("Succeeded"), reasons


def test_a_preempted_job_resumes_from_the_checkpoint_it_wrote_at_sigterm_and_succeeds(
    cluster: Cluster, sandbox: Sandbox, job_spec: Any
) -> None:
    # No periodic checkpoint before the end: the resume point can only be the one the trainer writes when the
    # node's shutdown sends it SIGTERM.
    total = STEPS
    spec = job_spec("preempted", every=10 * STEPS)
    name = cluster.create("preempted", **spec)
    first = trainer_pod(cluster, name, 0)
    first_log = sandbox.pod_log(cluster.ns, first["metadata"]["name"], TRAINER)
    wait_for_log(first_log, rf"\bstep 4/{total} loss")
    sandbox.preempt(first["spec"]["nodeName"])  # returns once the node's pods are down

    status = finish(cluster, sandbox, name)
    assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, name)}"
    assert status["restarts"] == {"failures": 0, "preemptions": 1}
    a0, a1 = status["attempts"]
    assert a0["outcome"] == "Preempted", a0
    saved_at = re.search(r"Preempted at step (\d+); checkpoint saved", a0["message"])
    assert saved_at, a0
    saved = int(saved_at.group(1))
    assert 4 <= saved < total
    assert (a1["outcome"], a1["startStep"]) == ("Succeeded", saved), a1
    # 0 steps lost: the first pod trained up to the checkpoint, the second restored it and went on from there.
    assert steps_logged(first_log, total)[-1] == saved
    second_log = sandbox.pod_log(cluster.ns, a1["podName"], TRAINER)
    assert f"restored step {saved} from" in second_log.read_text()
    assert steps_logged(second_log, total) == list(range(saved + 1, total + 1))
    summary = read_summary(spec["checkpoint"]["uri"])["attempts"]
    assert (summary[0]["end_step"], summary[1]["start_step"], summary[1]["end_step"]) == (saved, saved, total)
    cluster.said(name, "Preempted", "Succeeded")


def test_two_jobs_on_one_v5p8_node_run_one_after_the_other(cluster: Cluster, sandbox: Sandbox, job_spec: Any) -> None:
    names = [cluster.create(n, **job_spec(n, every=50)) for n in ("first", "second")]
    for name in names:
        status = finish(cluster, sandbox, name)
        assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, name)}"
    pods = [cluster.pod_of(cluster.train(name, 0)) for name in names]
    # The node has 4 chips and each pod takes all 4: one node for both, and no overlap in time.
    assert {p["spec"]["nodeName"] for p in pods} == {"v5p-8-spot-0"}
    earlier, later = sorted(pods, key=lambda p: terminated(p)["startedAt"])
    assert terminated(later)["startedAt"] >= terminated(earlier)["finishedAt"]
    events = kube_objects.list_objects(cluster.api, "v1", "Event", cluster.ns)
    waited = [
        e["message"]
        for e in events
        if e["involvedObject"].get("name") == later["metadata"]["name"] and e["reason"] == "FailedScheduling"
    ]
    assert any("Insufficient google.com/tpu" in msg for msg in waited), waited


def test_a_failing_training_pod_is_retried_then_the_job_fails_with_the_containers_message(
    cluster: Cluster, sandbox: Sandbox, job_spec: Any
) -> None:
    # Each attempt's trainer is killed as the kernel's OOM killer would (SIGKILL, exit code 137) once it has
    # read its inputs, before any JAX compilation: a failure that is retried, unlike a rejected config.
    name = cluster.create("crashing", **job_spec("crashing", every=50, runPolicy={"maxRestarts": 1}))
    for attempt in (0, 1):
        pod = trainer_pod(cluster, name, attempt)["metadata"]["name"]
        wait_for_log(sandbox.pod_log(cluster.ns, pod, TRAINER), r"\d+ records -> \d+ examples")
        kill_container(sandbox, cluster.ns, pod)

    status = finish(cluster, sandbox, name)
    assert status["phase"] == "Failed", status
    assert status["restarts"] == {"failures": 2, "preemptions": 0}
    assert [a["outcome"] for a in status["attempts"]] == ["Failed", "Failed"]
    failed = cluster.condition(name, "Failed")
    assert failed["reason"] == "TrainingFailed", failed
    message = failed["message"]
    assert "gave up after 2 failures (spec.runPolicy.maxRestarts=1)" in message, message
    # The container's own message (its log's last lines, terminationMessagePolicy FallbackToLogsOnError).
    assert "exit code 137" in message and "records -> " in message, message
    assert ("Warning", "Retrying") in {(t, r) for t, r, _ in cluster.said(name, "Retrying")}
    # Nothing is left running on the node.
    assert all(p["status"]["phase"] == "Failed" for p in cluster.children("Pod", name))


def kill_container(sandbox: Sandbox, namespace: str, pod: str) -> None:
    """SIGKILL the pod's container process: the node agent runs it with its config under the pod's directory."""
    marker = f"{sandbox.dir}/pods/{namespace}/{pod}/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "tpuforge_workloads.train" in cmdline and marker in cmdline:
            os.kill(int(proc.name), signal.SIGKILL)
            return
    raise AssertionError(f"no trainer process of pod {namespace}/{pod} is running")
