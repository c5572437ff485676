"""A FineTuneJob on a two-host slice (v5p-16) on the sandbox: the operator's JobSet, the node agent playing the
JobSet controller and both hosts' kubelets, two trainer processes of 4 CPU devices each joined by
jax.distributed into one fsdp=2 x tp=4 mesh, a preemption of one host, the resume with no step lost, the
merge and its verification. The helpers are test_pipeline's."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.fixtures.finetunejob import Cluster
from tests.fixtures.models import read_summary
from tests.fixtures.pipelines import JOB_TIMEOUT, STEPS, TRAINER, finish, pod_logs, steps_logged, wait_for_log
from tpuforge.api.constants import JOB_COMPLETION_INDEX
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_merge import MERGER_CONTAINER
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_workloads.storage import commit

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

HOSTS = ("v5p-16-spot-0-0", "v5p-16-spot-0-1")
V5P_16 = {"slice": "v5p-16", "spot": True, "mesh": {"fsdp": 2, "tp": 4}}


def host_pods(cluster: Cluster, name: str, attempt: int) -> list[dict[str, Any]]:
    """The attempt's trainer pods, in host order, once every host's pod runs."""

    def running() -> list[dict[str, Any]] | None:
        attempts = cluster.status(name).get("attempts") or []
        names = attempts[attempt].get("pods") if len(attempts) > attempt else None
        if not names or len(names) < len(HOSTS):
            return None
        pods = [kube_objects.get(cluster.api, "v1", "Pod", cluster.ns, n) for n in names]
        return pods if all(p and p["status"].get("phase") == "Running" for p in pods) else None

    pods: list[dict[str, Any]] = wait_for(running, JOB_TIMEOUT, f"both hosts of attempt {attempt} of {name}")
    return sorted(pods, key=lambda p: int(p["metadata"]["annotations"][JOB_COMPLETION_INDEX]))


def test_a_two_host_job_is_preempted_on_one_host_resumes_with_no_step_lost_and_merges_a_verified_model(
    cluster: Cluster, sandbox: Sandbox, job_spec: Any
) -> None:
    # No periodic checkpoint before the end: the resume point can only be the step both hosts agree on and
    # save when one host's node shutdown sends its trainer SIGTERM.
    total = STEPS
    spec = job_spec("multihost", every=10 * STEPS, merge=True, tpu=V5P_16)
    name = cluster.create("multihost", **spec)
    first = host_pods(cluster, name, 0)
    assert sorted(p["spec"]["nodeName"] for p in first) == list(HOSTS)  # one pod per host of the one slice
    logs = [sandbox.pod_log(cluster.ns, p["metadata"]["name"], TRAINER) for p in first]
    wait_for_log(logs[0], rf"\bstep 4/{total} loss")
    victim = first[1]
    sandbox.preempt(victim["spec"]["nodeName"])  # returns once that node's pod is down

    status = finish(cluster, sandbox, name)
    assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, name)}"
    assert status["restarts"] == {"failures": 0, "preemptions": 1}
    a0, a1 = status["attempts"]
    assert a0["outcome"] == "Preempted", a0
    assert a0["pods"] == [p["metadata"]["name"] for p in first]
    # The step both hosts agreed on and saved is where attempt 1 starts (the attempt's message is whichever
    # host's ending the operator saw first: the disruption, or a checkpoint's exit 83).
    saved = a1["startStep"]
    assert a1["outcome"] == "Succeeded" and saved is not None and 4 <= saved < total, a1
    assert len(a1["pods"]) == len(HOSTS)

    # 0 steps lost: attempt 0 trained up to the checkpoint both hosts saved; attempt 1 restored it and went
    # on from there.
    assert steps_logged(logs[0], total)[-1] == saved
    second = [sandbox.pod_log(cluster.ns, p, TRAINER) for p in a1["pods"]]
    assert all(f"restored step {saved} from" in log.read_text() for log in second)
    assert steps_logged(second[0], total) == list(range(saved + 1, total + 1))
    summary = read_summary(spec["checkpoint"]["uri"])["attempts"]
    assert (summary[0]["end_step"], summary[1]["start_step"], summary[1]["end_step"]) == (saved, saved, total)

    # The Event names the host that was taken away.
    preempted = [msg for _, reason, msg in cluster.said(name, "Preempted") if reason == "Preempted"]
    assert preempted and preempted[0].startswith("host 1/2 preempted on"), preempted
    assert f"host 1 of 2 (pod {victim['metadata']['name']}" in status["attempts"][0]["message"]

    # The merge reads the multi-host checkpoint like any other, and its output is complete and verified.
    out = spec["output"]["uri"]
    manifest = commit.require_complete(out, checksums=True)
    assert manifest.metadata["step"] == total
    merge_pod = next(
        p for p in cluster.children("Pod", name) if p["metadata"]["labels"].get("job-name") == cluster.merge(name)
    )
    merge_log = sandbox.pod_log(cluster.ns, merge_pod["metadata"]["name"], MERGER_CONTAINER).read_text()
    assert re.search(r"verify passed: max \|logit diff\| \S+", merge_log), merge_log[-2000:]
