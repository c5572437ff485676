"""The order the operator creates a FineTuneJob's children in: what a pod needs at creation, and each Role before
the RoleBinding that names it (the apiserver refuses, with 404, a binding whose Role it cannot read yet, unless
its creator is a cluster admin; the chart's operator is not), and when a create a webhook did not answer is tried
again."""

from __future__ import annotations

from tpuforge.controllers.finetune.controller import WEBHOOK_RETRY_SECONDS, creation_groups, webhook_retry_seconds


def obj(kind: str) -> dict[str, str]:
    return {"kind": kind}


def test_roles_and_pod_prerequisites_come_before_bindings_and_jobs() -> None:
    kinds = ["Job", "RoleBinding", "Role", "ConfigMap", "ServiceAccount"]
    groups = creation_groups([obj(k) for k in kinds])
    assert [sorted(o["kind"] for o in g) for g in groups] == [
        ["ConfigMap", "Role", "ServiceAccount"],
        ["Job", "RoleBinding"],
    ]
    assert creation_groups([obj("Job")]) == [[obj("Job")]]


def test_a_create_refused_for_want_of_a_webhook_is_tried_again_sooner_first_then_every_30_s() -> None:
    assert [webhook_retry_seconds(n) for n in range(1, 6)] == [5.0, 10.0, 20.0, 30.0, 30.0]
    assert webhook_retry_seconds(100) == WEBHOOK_RETRY_SECONDS
