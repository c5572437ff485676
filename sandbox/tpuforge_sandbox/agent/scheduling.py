"""The scheduler's part of the node agent, as pure functions over Pod and Node JSON: node selector, required
node affinity, taints and tolerations, and the google.com/tpu extended resource.

CPU and memory requests are not counted: every emulated node shares one laptop, and manifests written for
GKE ask for far more than it has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tpuforge.api.constants import TPU_RESOURCE

# JobSet's exclusive placement, as its controller marks the pods: the pod template's annotation names the node
# label of a topology domain, and each child Job's pods carry the Job's key. JobSet's pod webhook turns these
# into pod (anti-)affinity and a node selector for followers; the sandbox's scheduler reads them directly.
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
JOB_KEY = "jobset.sigs.k8s.io/job-key"

Obj = Mapping[str, Any]
TERMINAL = ("Succeeded", "Failed")


def tpu_request(pod: Obj) -> int:
    """The pod's effective google.com/tpu request: the larger of the largest init container and the sum of
    the app containers (what kube-scheduler counts). Limits stand in for missing requests."""

    def of(c: Obj) -> int:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(TPU_RESOURCE, (res.get("limits") or {}).get(TPU_RESOURCE, 0))
        return int(str(value))

    spec = pod.get("spec") or {}
    app = sum(of(c) for c in spec.get("containers") or [])
    init = max((of(c) for c in spec.get("initContainers") or []), default=0)
    return max(app, init)


def tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_matches(expr: Obj, labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def selector_matches(pod: Obj, node: Obj) -> bool:
    """spec.nodeSelector and requiredDuringSchedulingIgnoredDuringExecution node affinity."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": (node.get("metadata") or {}).get("name", "")}
    return any(
        all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
        and all(_expression_matches(e, fields) for e in term.get("matchFields") or [])
        for term in terms
    )


def node_allocatable_tpu(node: Obj) -> int:
    return int(str(((node.get("status") or {}).get("allocatable") or {}).get(TPU_RESOURCE, 0)))


def node_is_ready(node: Obj) -> bool:
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def tpu_in_use(pods: Sequence[Obj], finished: Collection[str] = ()) -> Counter[str]:
    """google.com/tpu held per node by pods bound there and not finished (terminating pods still hold
    theirs). `finished` holds uids the agent knows have ended before the apiserver shows it."""
    used: Counter[str] = Counter()
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in TERMINAL:
            continue
        if (p.get("metadata") or {}).get("uid") in finished:
            continue
        used[node] += tpu_request(p)
    return used


def why_not(pod: Obj, node: Obj, used: Mapping[str, int]) -> str | None:
    """None when `pod` fits on `node`, else the scheduler-style reason."""
    spec = pod.get("spec") or {}
    if not node_is_ready(node):
        return "node(s) were not ready"
    if (node.get("spec") or {}).get("unschedulable"):
        return "node(s) were unschedulable"
    if not selector_matches(pod, node):
        return "node(s) didn't match node selector"
    tolerations = spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            value = f": {taint['value']}" if taint.get("value") else ""
            return f"node(s) had taint {{{taint.get('key')}{value}}}, that the pod didn't tolerate"
    want = tpu_request(pod)
    name = (node.get("metadata") or {}).get("name", "")
    if want and want > node_allocatable_tpu(node) - used.get(name, 0):
        return f"Insufficient {TPU_RESOURCE}"
    return None


def pick_node(pod: Obj, nodes: Sequence[Obj], used: Mapping[str, int]) -> tuple[str | None, str]:
    """The node to bind to (the one with the most free TPU chips left, as kube-scheduler's default spreads),
    or None and a message like kube-scheduler's FailedScheduling one."""
    fits: list[tuple[int, str]] = []
    reasons: Counter[str] = Counter()
    for node in nodes:
        reason = why_not(pod, node, used)
        name = node["metadata"]["name"]
        if reason is None:
            fits.append((-(node_allocatable_tpu(node) - used.get(name, 0)), name))
        else:
            reasons[reason] += 1
    if fits:
        return min(fits)[1], ""
    detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {detail}."


def exclusive_nodes(
    pod: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]]
) -> list[Obj] | None:
    """Exclusive placement (`alpha.jobset.sigs.k8s.io/exclusive-topology: <node label>`): one child Job per
    topology domain. The nodes `pod` may go to: its Job's domain once one of its pods is placed, else a
    domain no other JobSet Job's pod occupies. None when the pod asks for no exclusive placement."""
    meta = pod.get("metadata") or {}
    key = (meta.get("annotations") or {}).get(EXCLUSIVE_TOPOLOGY)
    own = (meta.get("labels") or {}).get(JOB_KEY)
    if not key or not own:
        return None
    domain = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(key) for n in nodes}
    mine, taken = set(), set()
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in TERMINAL or node not in domain:
            continue
        other = ((p.get("metadata") or {}).get("labels") or {}).get(JOB_KEY)
        if other == own:
            mine.add(domain[node])
        elif other:
            taken.add(domain[node])
    if mine:
        return [dict(n) for n in nodes if domain[n["metadata"]["name"]] in mine]
    return [
        dict(n)
        for n in nodes
        if domain[n["metadata"]["name"]] is not None and domain[n["metadata"]["name"]] not in taken
    ]
