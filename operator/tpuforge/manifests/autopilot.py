"""The GKE Autopilot profile of the rendered workloads, and a checker of what Autopilot admits. Pure.

On Autopilot GKE creates a node for each pod from the pod's own spec: the TPU from the accelerator and topology
selectors and the chips the pod requests, its size from the requests. `for_autopilot` turns a rendered Job,
JobSet or Deployment into that form; `autopilot_problems` says what in a pod spec Autopilot would refuse, or
what this profile promises and a pod breaks. The default (Standard) rendering never passes through here.

What the profile changes, pod by pod:
- Every container states CPU, memory and ephemeral-storage requests, and limits equal to them: Autopilot
  sizes and bills the node by the requests, and on every Autopilot version such a pod is admitted unchanged
  (no request is raised to a minimum behind the operator's back, no limit rewritten).
- The machine-type selector goes: Autopilot picks the TPU VM from the topology and the chips per pod (a v6e
  2x4 pod asking 8 chips gets the single-host ct6e-standard-8t), and creates the node to match.
- The TPU chips stay in both requests and limits, which Autopilot requires of TPU pods."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

from tpuforge.api.autopilot import NODE_POOL_LABELS
from tpuforge.api.constants import GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, INSTANCE_TYPE, TPU_RESOURCE
from tpuforge.api.resources import GIB, gib, quantity

Obj = dict[str, Any]

# What a container writes beside its sized volumes: its log, and the scratch emptyDir at /tmp that holds HOME and
# the caches (tpuforge.manifests.common.locked_down). A TPU container also keeps libtpu's logs there. The limit
# equals the request, so a container that outgrows it is evicted (a retried failure, not a wrong result).
CPU_SCRATCH_BYTES = 2 * GIB
TPU_SCRATCH_BYTES = 10 * GIB
# The capabilities a container may add on Autopilot without an allowlist: the container runtime's defaults,
# less NET_RAW, which Autopilot refuses. Only the checkers add any (SETUID and SETGID): the evaluation's, and
# GRPO's sidecar beside the trainer.
ALLOWED_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# The resources every container states on Autopilot, with limits equal to the requests.
SIZED = ("cpu", "memory", "ephemeral-storage")


def pod_specs(obj: Obj) -> list[Obj]:
    """The pod specs of a rendered workload (Job, JobSet, Deployment, Pod), the objects themselves (not copies);
    none for other kinds."""
    kind = obj.get("kind")
    if kind == "Pod":
        return [obj["spec"]]
    if kind in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        return [obj["spec"]["template"]["spec"]]
    if kind == "JobSet":
        return [r["template"]["spec"]["template"]["spec"] for r in obj["spec"]["replicatedJobs"]]
    return []


def containers(pod: Obj) -> list[Obj]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def is_tpu_pod(pod: Obj) -> bool:
    return any(TPU_RESOURCE in (c.get("resources") or {}).get("requests", {}) for c in containers(pod))


def _sized_volumes(pod: Obj) -> dict[str, Decimal]:
    """The disk-backed emptyDirs with a size, by name (a memory-backed one counts against memory instead)."""
    out = {}
    for v in pod.get("volumes") or []:
        empty = v.get("emptyDir")
        if empty is not None and empty.get("medium") != "Memory" and empty.get("sizeLimit"):
            out[v["name"]] = quantity(empty["sizeLimit"])
    return out


def _ephemeral_requests(pod: Obj) -> dict[str, str]:
    """The ephemeral-storage request of each container (by name) that states none: its scratch, and each sized
    emptyDir charged to the first container that mounts it, unless a container that mounts it states a request
    of its own (then that request holds it, as a ServingDeployment's NodeLocal model copy's does)."""
    sized = _sized_volumes(pod)
    every = containers(pod)
    stated = [c for c in every if "ephemeral-storage" in (c.get("resources") or {}).get("requests", {})]
    held = {m["name"] for c in stated for m in c.get("volumeMounts") or []}
    charged: set[str] = set()
    out = {}
    for c in every:
        if c in stated:
            continue
        tpu = TPU_RESOURCE in (c.get("resources") or {}).get("requests", {})
        total = Decimal(TPU_SCRATCH_BYTES if tpu else CPU_SCRATCH_BYTES)
        for m in c.get("volumeMounts") or []:
            name = m["name"]
            if name in sized and name not in held and name not in charged:
                charged.add(name)
                total += sized[name]
        out[c["name"]] = gib(int(total))
    return out


def _autopilot_container(container: Obj, ephemeral: str | None) -> Obj:
    out = dict(container)
    res = out.get("resources") or {}
    requests = dict(res.get("requests") or {})
    if ephemeral is not None:
        requests["ephemeral-storage"] = ephemeral
    limits = {k: v for k, v in (res.get("limits") or {}).items() if k not in SIZED}
    limits |= {k: requests[k] for k in SIZED if k in requests}
    out["resources"] = {"requests": requests, "limits": limits}
    return out


def autopilot_pod(pod: Obj) -> Obj:
    """`pod` (a pod spec) as it runs on Autopilot (the module's docstring says what changes). Returns a copy."""
    out = copy.deepcopy(pod)
    selector = out.get("nodeSelector")
    if selector and GKE_TPU_ACCELERATOR in selector:
        selector.pop(INSTANCE_TYPE, None)
    ephemeral = _ephemeral_requests(out)
    for key in ("initContainers", "containers"):
        if key in out:
            out[key] = [_autopilot_container(c, ephemeral.get(c["name"])) for c in out[key]]
    return out


def for_autopilot(obj: Obj) -> Obj:
    """A rendered object as the Autopilot profile creates it: each of its pod specs through `autopilot_pod`;
    any other object unchanged. Returns a copy."""
    out = copy.deepcopy(obj)
    kind = out.get("kind")
    if kind == "Pod":
        out["spec"] = autopilot_pod(out["spec"])
    elif kind in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        out["spec"]["template"]["spec"] = autopilot_pod(out["spec"]["template"]["spec"])
    elif kind == "JobSet":
        for r in out["spec"]["replicatedJobs"]:
            r["template"]["spec"]["template"]["spec"] = autopilot_pod(r["template"]["spec"]["template"]["spec"])
    return out


def _selected_node_labels(pod: Obj) -> set[str]:
    keys = set((pod.get("nodeSelector") or {}).keys())
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    preferred = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    ) or []
    terms = [*(required.get("nodeSelectorTerms") or []), *(p.get("preference") or {} for p in preferred)]
    for term in terms:
        keys |= {e["key"] for e in term.get("matchExpressions") or []}
    return keys


def _container_problems(c: Obj) -> list[str]:
    name = c.get("name", "?")
    out = []
    ctx = c.get("securityContext") or {}
    if ctx.get("privileged"):
        out.append(f"container {name}: privileged (Autopilot refuses privileged containers)")
    added = set((ctx.get("capabilities") or {}).get("add") or [])
    extra = sorted(added - ALLOWED_CAPABILITIES)
    if extra:
        out.append(f"container {name}: adds capabilities {extra} (Autopilot admits only the runtime's defaults)")
    res = c.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    for key in SIZED:
        if key not in requests:
            out.append(f"container {name}: no {key} request")
        elif limits.get(key) is None or quantity(str(limits[key])) != quantity(str(requests[key])):
            out.append(f"container {name}: {key} limit {limits.get(key)!r} is not its request {requests[key]!r}")
    if TPU_RESOURCE in requests and str(limits.get(TPU_RESOURCE)) != str(requests[TPU_RESOURCE]):
        out.append(f"container {name}: {TPU_RESOURCE} must be in both requests and limits, equal")
    for port in c.get("ports") or []:
        if port.get("hostPort"):
            out.append(f"container {name}: hostPort {port['hostPort']} (a host namespace)")
    return out


def autopilot_problems(pod: Obj) -> list[str]:
    """What in `pod` (a pod spec) GKE Autopilot would refuse, or what breaks this profile's own rules (requests
    and equal limits for CPU, memory and ephemeral storage; TPUs chosen by accelerator and topology only). Empty
    when the pod is Autopilot-valid."""
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"{key}: true (Autopilot refuses host namespaces)")
    for v in pod.get("volumes") or []:
        if "hostPath" in v:
            out.append(f"volume {v['name']}: hostPath (Autopilot refuses the node's filesystem)")
    labels = _selected_node_labels(pod)
    for key in sorted(labels & set(NODE_POOL_LABELS)):
        out.append(f"selects node label {key}: Autopilot creates and names its node pools itself")
    if is_tpu_pod(pod):
        selector = pod.get("nodeSelector") or {}
        for key in (GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY):
            if key not in selector:
                out.append(f"a TPU pod without nodeSelector {key} (Autopilot chooses the TPU by it)")
        if INSTANCE_TYPE in labels:
            out.append(f"a TPU pod selects {INSTANCE_TYPE}: Autopilot picks the machine from topology and chips")
    for c in containers(pod):
        out += _container_problems(c)
    return out


def object_problems(obj: Obj) -> list[str]:
    """`autopilot_problems` of every pod spec of a rendered object, each prefixed with the object's kind/name."""
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    return [f"{where}: {p}" for pod in pod_specs(obj) for p in autopilot_problems(pod)]


__all__ = [
    "ALLOWED_CAPABILITIES",
    "autopilot_pod",
    "autopilot_problems",
    "for_autopilot",
    "object_problems",
    "pod_specs",
]
