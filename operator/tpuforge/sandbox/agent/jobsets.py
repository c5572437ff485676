"""The JobSet controller's part of the node agent (GKE clusters run the real one; Kubernetes 1.20 has none).

Per JobSet: one child Job per replicatedJob replica (`<jobset>-<rjob>-<jobIndex>`, owned by the JobSet, with
JobSet's labels and annotations), the headless Service named after its subdomain, and its status (conditions
Completed / Failed / Suspended, terminalState, replicatedJobsStatus) under failurePolicy and successPolicy.
The 1.20 Job controller creates and counts the pods (it has no Indexed completion mode); the agent, as the
Indexed Job controller would, gives each pod its completion index before it schedules it, and, as kubelet,
the hostname `<job>-<index>` and JOB_COMPLETION_INDEX (containers.py).

There is no DNS: the pods reach each other by loopback addresses and ports (jobset_network.py), which the
controller chooses once per JobSet and keeps in its `sandbox.tpuforge.dev/loopback-ports` annotation.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from tpuforge.sandbox.agent.jobset_labels import (
    API_VERSION,
    COMPLETION_INDEX,
    CONTROLLER_SWITCH,
    EXCLUSIVE_TOPOLOGY,
    JOB_GLOBAL_INDEX,
    JOB_INDEX,
    JOB_KEY,
    JOBSET_NAME,
    JOBSET_UID,
    LOOPBACK_IP,
    LOOPBACK_PORTS,
    REPLICATED_JOB,
    REPLICATED_JOB_REPLICAS,
    RESTART_ATTEMPT,
)
from tpuforge.sandbox.agent.jobset_network import free_loopback_port, loopback_ip, ports_in_env, subdomain
from tpuforge.sandbox.agent.scheduling import TERMINAL
from tpuforge.sandbox.kubeapi import Kube, now

log = logging.getLogger("tpuforge.sandbox.agent")
Obj = dict[str, Any]

# Reasons and messages as the JobSet controller writes them.
COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
MAX_RESTARTS = ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
SUSPENDED = ("SuspendedJobs", "jobset is suspended")
RESUMED = ("ResumeJobs", "jobset is resumed")


# -- pure parts ------------------------------------------------------------------------------------------------
def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref["uid"])
    return None


def job_finished(job: Mapping[str, Any]) -> str | None:
    """ "Complete" or "Failed" when the Job has that condition, else None."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def owner_ref(obj: Mapping[str, Any], api_version: str, kind: str) -> Obj:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_jobs(js: Mapping[str, Any]) -> list[Obj]:
    """The Jobs the JobSet controller would create: one per replica of each replicatedJob."""
    meta, spec = js["metadata"], js.get("spec") or {}
    ns, name = meta["namespace"], meta["name"]
    restarts = str((js.get("status") or {}).get("restarts") or 0)
    sub = subdomain(js)
    inherited = {k: v for k, v in (meta.get("annotations") or {}).items() if k in (EXCLUSIVE_TOPOLOGY, LOOPBACK_PORTS)}
    jobs, global_index = [], 0
    for rjob in spec.get("replicatedJobs") or []:
        replicas = int(rjob.get("replicas", 1))
        for j in range(replicas):
            job_name = f"{name}-{rjob['name']}-{j}"
            marks = {
                JOBSET_NAME: name,
                JOBSET_UID: meta["uid"],
                REPLICATED_JOB: rjob["name"],
                REPLICATED_JOB_REPLICAS: str(replicas),
                JOB_INDEX: str(j),
                JOB_GLOBAL_INDEX: str(global_index),
                RESTART_ATTEMPT: restarts,
                JOB_KEY: hashlib.sha1(f"{ns}/{job_name}".encode()).hexdigest(),
            }
            template = copy.deepcopy(rjob.get("template") or {})
            job_spec = template.get("spec") or {}
            pod_template = job_spec.setdefault("template", {})
            pod_meta = pod_template.setdefault("metadata", {})
            pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **marks}
            pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **marks, **inherited}
            if sub:
                pod_template.setdefault("spec", {})["subdomain"] = sub
            job_meta = template.get("metadata") or {}
            jobs.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": job_name,
                        "namespace": ns,
                        "labels": {**(job_meta.get("labels") or {}), **marks},
                        "annotations": {**(job_meta.get("annotations") or {}), **marks, **inherited},
                        "ownerReferences": [owner_ref(js, API_VERSION, "JobSet")],
                    },
                    "spec": job_spec,
                }
            )
            global_index += 1
    return jobs


def headless_service(js: Mapping[str, Any], name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": js["metadata"]["namespace"],
            "ownerReferences": [owner_ref(js, API_VERSION, "JobSet")],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {JOBSET_NAME: js["metadata"]["name"]},
            "publishNotReadyAddresses": True,
        },
    }


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def desired_status(
    js: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]], pods_by_job: Mapping[str, list[Obj]]
) -> Obj:
    """replicatedJobsStatus, and the terminal outcome when there is one: a child Job failing fails the JobSet
    (restarts are not emulated, so any maxRestarts behaves as 0); the successPolicy (All, or Any, of the
    target replicatedJobs' Jobs) completes it."""
    spec = js.get("spec") or {}
    by_rjob: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for job in jobs:
        by_rjob[(job["metadata"].get("labels") or {}).get(REPLICATED_JOB, "")].append(job)
    rjobs_status = []
    for rjob in spec.get("replicatedJobs") or []:
        counts = dict.fromkeys(("ready", "succeeded", "failed", "active", "suspended"), 0)
        for job in by_rjob.get(rjob["name"], []):
            done = job_finished(job)
            if done == "Complete":
                counts["succeeded"] += 1
            elif done == "Failed":
                counts["failed"] += 1
            else:
                counts["active"] += 1
                want = int((job.get("spec") or {}).get("parallelism") or 1)
                pods = pods_by_job.get(job["metadata"]["uid"], [])
                ready = sum(1 for p in pods if _pod_ready(p))
                if ready + int((job.get("status") or {}).get("succeeded") or 0) >= want:
                    counts["ready"] += 1
        rjobs_status.append({"name": rjob["name"], **counts})
    out: Obj = {"replicatedJobsStatus": rjobs_status}
    if any(s["failed"] for s in rjobs_status):
        out["terminalState"] = "Failed"
        out["reason"], out["message"] = MAX_RESTARTS if spec.get("failurePolicy") else FAILED_JOBS
        return out
    success = spec.get("successPolicy") or {}
    targets = set(success.get("targetReplicatedJobs") or [r["name"] for r in spec.get("replicatedJobs") or []])
    wanted = {r["name"]: int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [] if r["name"] in targets}
    succeeded = {s["name"]: s["succeeded"] for s in rjobs_status if s["name"] in targets}
    if (success.get("operator") or "All") == "Any":
        complete = any(succeeded.values())
    else:
        complete = bool(wanted) and all(succeeded.get(n, 0) >= want for n, want in wanted.items())
    if complete:
        out["terminalState"] = "Completed"
        out["reason"], out["message"] = COMPLETED
    return out


def with_condition(
    conditions: Sequence[Mapping[str, Any]], type_: str, status: bool, reason: str, message: str
) -> list[Obj]:
    """`conditions` with `type_` set (its lastTransitionTime kept when the status did not change)."""
    value = "True" if status else "False"
    out, found = [], False
    for c in conditions:
        if c.get("type") == type_:
            found = True
            changed = c.get("status") != value
            c = {**c, "status": value, "reason": reason, "message": message}
            if changed:
                c["lastTransitionTime"] = now()
        out.append(dict(c))
    if not found:
        out.append({"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": now()})
    return out


def assign_indexes(job: Mapping[str, Any], pods: Sequence[Obj]) -> dict[str, int]:
    """Completion indexes for the Job's pods that have none (pod uid -> index): the lowest not held by a pod
    that is running or succeeded, as an Indexed Job gives a replacement pod the index it replaces."""
    completions = int((job.get("spec") or {}).get("completions") or 1)
    held: set[int] = set()
    unindexed = []
    for p in pods:
        value = (p["metadata"].get("annotations") or {}).get(COMPLETION_INDEX)
        if value is None:
            if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") not in TERMINAL:
                unindexed.append(p)
        elif (p.get("status") or {}).get("phase") != "Failed":
            held.add(int(value))
    free = [i for i in range(completions) if i not in held]
    unindexed.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
    return {p["metadata"]["uid"]: i for p, i in zip(unindexed, free, strict=False)}


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


# -- the controller ------------------------------------------------------------------------------------------
class JobSetController:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.services: set[str] = set()  # JobSet uids whose Service exists

    def reconcile(self, pods: list[Obj]) -> set[str]:
        """One pass over every JobSet; then completion indexes for new pods of their Jobs. Returns the uids
        of pods that must not be scheduled yet (no index recorded)."""
        jobsets = self.kube.list_jobsets()
        if not jobsets:
            return set()
        off = {n["metadata"]["name"] for n in self.kube.list_namespaces(f"{CONTROLLER_SWITCH}=off")}
        jobsets = [js for js in jobsets if js["metadata"]["namespace"] not in off]
        jobs = self.kube.list_jobs()
        jobs_by_owner: dict[str, list[Obj]] = defaultdict(list)
        for job in jobs:
            uid = controller_uid(job)
            if uid:
                jobs_by_owner[uid].append(job)
        pods_by_job: dict[str, list[Obj]] = defaultdict(list)
        for pod in pods:
            uid = controller_uid(pod)
            if uid:
                pods_by_job[uid].append(pod)
        for js in jobsets:
            if js["metadata"].get("deletionTimestamp"):
                continue
            try:
                self._sync(js, jobs_by_owner.get(js["metadata"]["uid"], []), pods_by_job)
            except ApiException as e:
                log.warning(
                    "JobSet %s/%s: %s %s", js["metadata"]["namespace"], js["metadata"]["name"], e.status, e.reason
                )
        return self._index_pods(jobs, jobsets, pods_by_job)

    def _sync(self, js: Obj, jobs: list[Obj], pods_by_job: Mapping[str, list[Obj]]) -> None:
        meta, spec, status = js["metadata"], js.get("spec") or {}, js.get("status") or {}
        ns, name = meta["namespace"], meta["name"]
        active = [j for j in jobs if not job_finished(j) and not j["metadata"].get("deletionTimestamp")]
        if status.get("terminalState"):
            for job in active:  # a finished JobSet keeps no running Jobs
                self.kube.delete_job(ns, job["metadata"]["name"])
            return
        if LOOPBACK_PORTS not in (meta.get("annotations") or {}):
            ports = {str(p): free_loopback_port() for p in ports_in_env(js)}
            self.kube.patch_jobset(ns, name, {"metadata": {"annotations": {LOOPBACK_PORTS: json.dumps(ports)}}})
            return  # the next pass sees the annotation and copies it to the Jobs
        conditions = status.get("conditions") or []
        if spec.get("suspend"):
            for job in active:  # 1.20 Jobs cannot be suspended: their pods go with them
                self.kube.delete_job(ns, job["metadata"]["name"])
            if not any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions):
                self._patch_status(js, {"conditions": with_condition(conditions, "Suspended", True, *SUSPENDED)})
                self.kube.event(js, "Normal", SUSPENDED[0], SUSPENDED[1], component="jobset-controller")
            return
        if any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions):
            conditions = with_condition(conditions, "Suspended", False, *RESUMED)
            self.kube.event(js, "Normal", RESUMED[0], RESUMED[1], component="jobset-controller")
        sub = subdomain(js)
        if sub and meta["uid"] not in self.services:
            self.kube.create_service(ns, headless_service(js, sub))
            self.services.add(meta["uid"])
        existing = {j["metadata"]["name"] for j in jobs}
        for job in child_jobs(js):
            if job["metadata"]["name"] not in existing:
                self.kube.create_job(ns, job)
        want = desired_status(js, [j for j in jobs if not j["metadata"].get("deletionTimestamp")], pods_by_job)
        new: Obj = {"replicatedJobsStatus": want["replicatedJobsStatus"], "restarts": status.get("restarts") or 0}
        terminal = want.get("terminalState")
        if terminal:
            kind = "Completed" if terminal == "Completed" else "Failed"
            conditions = with_condition(conditions, kind, True, want["reason"], want["message"])
            new["terminalState"] = terminal
        new["conditions"] = conditions
        if any(status.get(k) != v for k, v in new.items()):
            self._patch_status(js, new)
        if terminal:
            self.kube.event(
                js,
                "Normal" if terminal == "Completed" else "Warning",
                want["reason"],
                want["message"],
                component="jobset-controller",
            )
            for job in active:
                if job_finished(job) is None:
                    self.kube.delete_job(ns, job["metadata"]["name"])

    def _patch_status(self, js: Obj, status: Obj) -> None:
        self.kube.patch_jobset_status(js["metadata"]["namespace"], js["metadata"]["name"], status)

    def _index_pods(self, jobs: list[Obj], jobsets: list[Obj], pods_by_job: Mapping[str, list[Obj]]) -> set[str]:
        jobset_uids = {js["metadata"]["uid"] for js in jobsets}
        held: set[str] = set()
        for job in jobs:
            if controller_uid(job) not in jobset_uids:
                continue
            pods = pods_by_job.get(job["metadata"]["uid"], [])
            per_job = int((job.get("spec") or {}).get("completions") or 1)
            global_index = int((job["metadata"].get("labels") or {}).get(JOB_GLOBAL_INDEX) or 0)
            for pod in pods:
                if (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX) is None:
                    held.add(pod["metadata"]["uid"])
            for uid, index in assign_indexes(job, pods).items():
                pod = next(p for p in pods if p["metadata"]["uid"] == uid)
                marks = {
                    "labels": {COMPLETION_INDEX: str(index)},
                    "annotations": {
                        COMPLETION_INDEX: str(index),
                        LOOPBACK_IP: loopback_ip(global_index * per_job + index),
                    },
                }
                try:
                    self.kube.patch_pod_metadata(pod["metadata"]["namespace"], pod["metadata"]["name"], marks)
                except ApiException as e:
                    log.info("indexing pod %s: %s %s", pod["metadata"]["name"], e.status, e.reason)
                    continue
                for k in ("labels", "annotations"):
                    pod["metadata"][k] = {**(pod["metadata"].get(k) or {}), **marks[k]}
                held.discard(uid)
        return held
