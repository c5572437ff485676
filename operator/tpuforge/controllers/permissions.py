"""The operator's Kubernetes permissions, declared once: what the Helm chart grants. Watching every namespace,
one ClusterRole holds them all (`cluster_role_rules(False)`); with operator.watchNamespaces the ClusterRole keeps
only the cluster-scoped ones (`cluster_role_rules(True)`) and a Role in each watched namespace holds the rest
(`namespace_role_rules()`), so the operator can create Jobs, Roles and RoleBindings nowhere else (e.g. not run
pods as kube-system's ServiceAccounts). Leader election's Lease is the operator's own namespace's only: a Role
there holds it (`own_namespace_role_rules()`). helm/tpuforge/templates/clusterrole.yaml, roles.yaml and
leader-election-rbac.yaml must equal them.
tests/helm/test_helm_chart.py checks both ways: every API call the controllers make is covered here, and nothing
here goes unused (by the controllers, by the operator's check of the served CRDs at start, or by the trainer's
Role, which the operator can only grant what it holds). kopf handles no resource here and follows neither CRDs nor
namespaces (tpuforge.controllers.main disables its scanning), so it needs nothing of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuforge.api.constants import GROUP


@dataclass(frozen=True)
class Rule:
    group: str  # "" for the core group
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    # The resources are cluster-scoped (no namespace): a Role cannot grant them.
    cluster_scoped: bool = False
    # Only in the operator's own namespace (a Role there), whichever namespaces it watches.
    own_namespace: bool = False


RULES: tuple[Rule, ...] = (
    # tpuforge.controllers.main.served_crd_drift: the served CRDs are the ones the operator was built with.
    Rule(
        "apiextensions.k8s.io",
        ("customresourcedefinitions",),
        ("list",),
        "the served CRDs' schemas, checked at start",
        cluster_scoped=True,
    ),
    Rule("", ("events",), ("create",), "the controllers: Events"),
    Rule(
        GROUP,
        ("finetunejobs",),
        ("list", "watch", "delete"),
        "FineTuneJobs: watched (by ServingDeployments too), deleted after ttlSecondsAfterFinished",
    ),
    # `get` and `patch`: the operator's status writes, and what it grants the trainer's Role.
    Rule(GROUP, ("finetunejobs/status",), ("get", "patch"), "FineTuneJob status (and the trainer's Role)"),
    Rule(GROUP, ("servingdeployments",), ("list", "watch"), "ServingDeployments: watched"),
    Rule(GROUP, ("servingdeployments/status",), ("patch",), "ServingDeployment status"),
    Rule("batch", ("jobs",), ("list", "watch", "create", "delete"), "preflight, training, merge, evaluation Jobs"),
    Rule("jobset.x-k8s.io", ("jobsets",), ("list", "watch", "create", "delete"), "multi-host training attempts"),
    Rule("kueue.x-k8s.io", ("workloads",), ("list", "watch"), "Kueue's Workloads: why a job is Queued"),
    Rule("", ("configmaps",), ("list", "watch", "create"), "the Jobs' configs"),
    Rule("", ("serviceaccounts",), ("create",), "the trainer's identity (jobs started before it was required)"),
    Rule("rbac.authorization.k8s.io", ("roles", "rolebindings"), ("create",), "the trainer's progress Role"),
    Rule("", ("pods",), ("list", "watch"), "both kinds' pods: progress, failures, readiness"),
    Rule("apps", ("deployments",), ("get", "list", "watch", "create", "update"), "the vLLM Deployment"),
    Rule(
        "",
        ("services", "persistentvolumeclaims"),
        ("get", "list", "watch", "create", "update"),
        "vLLM Service, XLA cache PVC",
    ),
    Rule(
        "policy",
        ("poddisruptionbudgets",),
        ("get", "list", "watch", "create", "update"),
        "the vLLM pods' PodDisruptionBudget",
    ),
    Rule(
        "monitoring.googleapis.com",
        ("podmonitorings",),
        ("get", "list", "watch", "create", "update"),
        "scrape config (GMP)",
    ),
    Rule(
        "monitoring.coreos.com",
        ("servicemonitors",),
        ("get", "list", "watch", "create", "update"),
        "scrape config (Prometheus)",
    ),
    Rule(
        "coordination.k8s.io",
        ("leases",),
        ("get", "create", "update"),
        "leader election (--leader-elect): the operator's Lease",
        own_namespace=True,
    ),
)


def _wire(rules: list[Rule]) -> list[dict[str, Any]]:
    return [{"apiGroups": [r.group], "resources": list(r.resources), "verbs": list(r.verbs)} for r in rules]


def cluster_role_rules(namespaced: bool) -> list[dict[str, Any]]:
    """The ClusterRole's rules; `namespaced`: the operator watches some namespaces only, and the ClusterRole
    keeps what a Role cannot grant."""
    if namespaced:
        return _wire([r for r in RULES if r.cluster_scoped])
    return _wire([r for r in RULES if not r.own_namespace])


def namespace_role_rules() -> list[dict[str, Any]]:
    """The rules of the Role in each watched namespace (operator.watchNamespaces)."""
    return _wire([r for r in RULES if not r.cluster_scoped and not r.own_namespace])


def own_namespace_role_rules() -> list[dict[str, Any]]:
    """The rules of the Role in the operator's own namespace (leader election)."""
    return _wire([r for r in RULES if r.own_namespace])
