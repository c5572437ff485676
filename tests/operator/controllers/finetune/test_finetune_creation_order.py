"""The order the operator creates a FineTuneJob's children in: what a pod needs at creation, and each Role before
the RoleBinding that names it (the apiserver refuses, with 404, a binding whose Role it cannot read yet, unless
its creator is a cluster admin; the chart's operator is not)."""

from __future__ import annotations

from tpuforge.controllers.finetune.controller import creation_groups


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
