"""An operator upgrade on the sandbox: the operator restarted with other default images (a new chart version's
images.tag) while a ServingDeployment serves and a FineTuneJob trains. No server's pods are rolled, and the
fine-tune's next stage runs the images it started with; a ServingDeployment takes the new ones when asked."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetunejob import Cluster, Operator, eventually
from tpuforge.api import REFRESH_IMAGES_ANNOTATION
from tpuforge.api.constants import API_VERSION
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.serving import VLLM_CONTAINER
from tpuforge.manifests.serving_inputs import names

pytestmark = pytest.mark.cluster

REGISTRY = "registry.example/tpuforge"
BEFORE = ("--image-registry", REGISTRY, "--image-tag", "0.1.0")
AFTER = ("--image-registry", REGISTRY, "--image-tag", "0.2.0")


def check(ok: bool) -> None:
    assert ok


def images(obj: dict[str, Any]) -> dict[str, str]:
    pod = obj["spec"]["template"]["spec"]
    return {c["name"]: c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]}


def deployment(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    return kube_objects.get(api, "apps/v1", "Deployment", ns, names(name).deployment)


def test_an_upgrade_rolls_no_server_and_keeps_a_finetunes_images(cluster: Cluster, operator: Operator) -> None:
    api, ns = cluster.api, cluster.ns
    operator.stop()
    operator.start(*BEFORE)
    job = cluster.create()
    cluster.wait_job(cluster.train(job, 0))
    cluster.set_pod(cluster.train(job, 0), "Running")
    cluster.wait_phase(job, "Training")
    body = {
        "apiVersion": API_VERSION,
        "kind": "ServingDeployment",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {"model": {"uri": "gs://b/models/gemma4-31b"}, "serviceAccountName": "default"},
    }
    kube_objects.create(api, body)
    eventually(lambda: check(deployment(api, ns, "chat") is not None), "the vLLM Deployment")
    served = deployment(api, ns, "chat")
    assert served is not None and images(served)[VLLM_CONTAINER] == f"{REGISTRY}/serving:0.1.0"

    operator.stop()
    operator.start(*AFTER)
    eventually(
        lambda: check((operator.metric("tpuforge_reconcile_total", kind="ServingDeployment") or 0) >= 1),
        "the upgraded operator reconciles the ServingDeployment",
    )
    cluster.set_pod(cluster.train(job, 0), "Succeeded", exit_code=0)
    merge = cluster.wait_job(cluster.merge(job))
    assert set(images(merge).values()) == {f"{REGISTRY}/merger:0.1.0"}  # the images the job started with
    now = deployment(api, ns, "chat")
    assert now is not None and now["metadata"]["generation"] == served["metadata"]["generation"]
    assert now["spec"]["template"] == served["spec"]["template"]  # no pod rolled

    # Asked for: the rollout to the operator's current images.
    patch = {"metadata": {"annotations": {REFRESH_IMAGES_ANNOTATION: "1"}}}
    kube_objects.patch(api, API_VERSION, "ServingDeployment", ns, "chat", patch)
    eventually(
        lambda: check(images(deployment(api, ns, "chat") or served)[VLLM_CONTAINER] == f"{REGISTRY}/serving:0.2.0"),
        "the Deployment rolls to the new images",
    )
