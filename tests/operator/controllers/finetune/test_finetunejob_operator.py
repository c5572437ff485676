"""The FineTuneJob operator as a process: killed and restarted mid-training, racing the trainer's status
writes (409 conflicts), and the trainer's own RBAC, checked with real ServiceAccount tokens."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetunejob import (
    WAIT,
    Cluster,
    Operator,
    eventually,
)
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.controllers.finetune.controller import WEBHOOK_RETRY_SECONDS
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox.procs import free_port

pytestmark = pytest.mark.cluster

CHILD_KINDS = ("ConfigMap", "Role", "RoleBinding", "Job")


def children(cluster: Cluster, name: str) -> dict[str, list[str]]:
    """uid of every child, by kind."""
    return {k: sorted(o["metadata"]["uid"] for o in cluster.children(k, name)) for k in CHILD_KINDS}


def check(ok: bool) -> None:
    assert ok


def sa_client(admin: client.ApiClient, namespace: str, service_account: str) -> client.ApiClient:
    """A client that authenticates with a fresh token of `service_account` (TokenRequest)."""
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    token = kube_client.request(admin, "POST", path, body=body)["status"]["token"]
    cfg = client.Configuration()
    cfg.host = admin.configuration.host
    cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg)


def report_progress(api: client.ApiClient, namespace: str, name: str, step: int) -> dict[str, Any]:
    """What the trainer writes: a JSON merge patch of status.progress."""
    ref = {"apiVersion": API_VERSION, "kind": FINETUNEJOB_KIND, "metadata": {"namespace": namespace, "name": name}}
    progress = {"step": step, "totalSteps": 10_000, "loss": 2.0 - step / 10_000, "tokensPerSecond": 760.0}
    return kube_objects.patch_status(api, ref, {"progress": progress})


def test_a_restarted_operator_duplicates_nothing_and_catches_up(cluster: Cluster, operator: Operator) -> None:
    name = cluster.create()
    cluster.wait_job(cluster.train(name, 0))
    cluster.set_pod(cluster.train(name, 0), "Running")
    before = cluster.wait_phase(name, "Training")
    kids = children(cluster, name)
    assert all(len(uids) == 1 for uids in kids.values()), kids

    operator.kill()
    operator.start()
    eventually(
        lambda: check((operator.metric("tpuforge_reconcile_total", kind="FineTuneJob") or 0) >= 1),
        "the new operator reconciles the job",
    )
    assert children(cluster, name) == kids
    after = cluster.status(name)
    for key in ("phase", "attempt", "attempts", "startTime", "restarts", "conditions"):
        assert after.get(key) == before.get(key), key

    # What happened while it was down is picked up once it is back.
    operator.kill()
    cluster.set_pod(cluster.train(name, 0), "Succeeded", exit_code=0)
    operator.start()
    cluster.wait_phase(name, "Merging")
    cluster.wait_job(cluster.merge(name))
    assert len(cluster.children("Job", name)) == 2
    assert [r for _, r, _ in cluster.said(name, "Merging")].count("Training") == 1


def test_status_conflicts_with_the_trainer_are_retried(cluster: Cluster, operator: Operator) -> None:
    name = cluster.create()
    cluster.wait_job(cluster.train(name, 0))
    trainer = sa_client(cluster.api, cluster.ns, "default")  # the spec's serviceAccountName
    stop = threading.Event()
    steps: list[int] = []

    def spam() -> None:  # far more often than a real trainer, to race every operator write
        step = 0
        while not stop.is_set():
            step += 1
            report_progress(trainer, cluster.ns, name, step)
            steps.append(step)

    writer = threading.Thread(target=spam, daemon=True)
    writer.start()
    try:
        cluster.set_pod(cluster.train(name, 0), "Running")
        cluster.wait_phase(name, "Training")
        cluster.set_pod(cluster.train(name, 0), "Succeeded", exit_code=0)
        cluster.wait_job(cluster.merge(name))
        cluster.set_pod(cluster.merge(name), "Succeeded", exit_code=0)
        cluster.wait_phase(name, "Succeeded")
        eventually(
            lambda: check((operator.metric("tpuforge_reconcile_conflicts_total", kind="FineTuneJob") or 0) > 0),
            "a conflict happened",
        )
    finally:
        stop.set()
        writer.join(10)
    st = cluster.status(name)
    assert st["progress"]["step"] == steps[-1]  # the trainer's keys are the trainer's
    assert st["restarts"] == {"failures": 0, "preemptions": 0}
    reasons = [r for _, r, _ in cluster.said(name, "Succeeded")]
    assert sorted(reasons) == ["Created", "Merging", "Succeeded", "Training"]  # each transition said once


def test_the_trainer_account_reports_its_own_progress_and_nothing_else(cluster: Cluster) -> None:
    for account in ("mine", "other"):  # one ServiceAccount each, as the platform team would give them
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": cluster.ns}}
        kube_objects.create(cluster.api, sa)
    mine, other = cluster.create(serviceAccountName="mine"), cluster.create(serviceAccountName="other")
    cluster.wait_job(cluster.train(mine, 0))
    cluster.wait_job(cluster.train(other, 0))
    trainer = sa_client(cluster.api, cluster.ns, "mine")
    assert report_progress(trainer, cluster.ns, mine, 7)["status"]["progress"]["step"] == 7
    with pytest.raises(kube_client.ApiException) as denied:
        report_progress(trainer, cluster.ns, other, 7)
    assert denied.value.status == 403
    # Nor can it touch the spec of its own job.
    with pytest.raises(kube_client.ApiException) as spec_denied:
        cluster_edit = {"spec": {"runPolicy": {"maxRestarts": 99}}}
        kube_objects.patch(trainer, API_VERSION, FINETUNEJOB_KIND, cluster.ns, mine, cluster_edit)
    assert spec_denied.value.status == 403
    # Nor read the namespace's Secrets, listed or by name.
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_secret(cluster.ns, {"metadata": {"name": "hf-token"}, "stringData": {"token": "x"}})
    as_trainer = client.CoreV1Api(trainer)
    for read in (
        lambda: as_trainer.list_namespaced_secret(cluster.ns),
        lambda: as_trainer.read_namespaced_secret("hf-token", cluster.ns),
    ):
        with pytest.raises(kube_client.ApiException) as secret_denied:
            read()
        assert secret_denied.value.status == 403


def test_a_platform_service_account_is_used_and_bound(cluster: Cluster) -> None:
    kube_objects.create(
        cluster.api,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gcs-reader", "namespace": cluster.ns}},
    )
    name = cluster.create(serviceAccountName="gcs-reader")
    job = cluster.wait_job(cluster.train(name, 0))
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "gcs-reader"
    assert cluster.children("ServiceAccount", name) == []  # the operator made none
    eventually(lambda: check(len(cluster.children("RoleBinding", name)) == 1), "the RoleBinding exists")
    trainer = sa_client(cluster.api, cluster.ns, "gcs-reader")
    assert report_progress(trainer, cluster.ns, name, 3)["status"]["progress"]["step"] == 3


def test_a_webhook_that_does_not_answer_is_named_in_a_condition_until_it_does(
    cluster: Cluster, operator: Operator
) -> None:
    """As on a private cluster whose firewall keeps the control plane from JobSet's or Kueue's webhook (9443):
    here a webhook for the namespace's Jobs whose address nothing listens on."""
    webhook = "jobs.unreachable.tpuforge.dev"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"unreachable-{cluster.ns}"},
        "webhooks": [
            {
                "name": webhook,
                "clientConfig": {"url": f"https://127.0.0.1:{free_port()}/validate"},
                "rules": [
                    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]}
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": cluster.ns}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    configs = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    kube_client.request(cluster.api, "POST", configs, body=config)
    try:
        name = cluster.create()
        eventually(
            lambda: check(any(c["type"] == "WebhooksReachable" for c in cluster.status(name).get("conditions", []))),
            "the WebhooksReachable condition",
        )
        cond = cluster.condition(name, "WebhooksReachable")
        assert (cond["status"], cond["reason"]) == ("False", "WebhookUnreachable")
        assert webhook in cond["message"] and "9443" in cond["message"]
        assert ("Warning", "WebhookDown", f"webhook {webhook!r} unreachable") in cluster.said(name, "WebhookDown")
        assert cluster.children("Job", name) == []
    finally:
        kube_client.request(cluster.api, "DELETE", f"{configs}/{config['metadata']['name']}")
    # Retried, and created once the webhook is gone: a try just after the DELETE may still meet the apiserver's
    # cached webhook, and the next comes up to WEBHOOK_RETRY_SECONDS later.
    cluster.wait_job(cluster.train(name, 0), timeout=WEBHOOK_RETRY_SECONDS + WAIT)
    eventually(lambda: check(cluster.condition(name, "WebhooksReachable")["status"] == "True"), "reachable again")
