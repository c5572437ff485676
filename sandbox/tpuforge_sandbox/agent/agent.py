"""The node agent: scheduler and kubelet for every emulated node, in one process.

Level-based: each pass reads every pod (from memory: agent/podcache.py keeps them by LIST and WATCH) and lists
the nodes, and does what is missing (bind pending pods, start pods bound to its nodes, stop deleted ones,
preempt annotated nodes). A pod change makes the next pass come sooner.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from kubernetes.client.exceptions import ApiException

from tpuforge_sandbox.agent.logserver import serve_logs
from tpuforge_sandbox.agent.podcache import PodCache, with_bindings
from tpuforge_sandbox.agent.podstatus import AgentContext
from tpuforge_sandbox.agent.runner import PodRunner
from tpuforge_sandbox.agent.scheduling import TERMINAL, exclusive_nodes, pick_node, tpu_in_use, tpu_request
from tpuforge_sandbox.config import GKE_SHUTDOWN_GRACE_SECONDS, SandboxConfig
from tpuforge_sandbox.custommetrics import pod_targets
from tpuforge_sandbox.gcs import gcs_env
from tpuforge_sandbox.kubeapi import Kube, new_api_client, now
from tpuforge_sandbox.nodes import EMULATED_LABEL, PREEMPT_ANNOTATION, emulated_nodes, node_status
from tpuforge_sandbox.pki import Pki

log = logging.getLogger("tpuforge_sandbox.agent")
Obj = dict[str, Any]

PASS_INTERVAL = 2.0
HEARTBEAT_INTERVAL = 10.0
# What kubelet's graceful node shutdown writes on each pod, and the condition it adds (Kubernetes >= 1.26;
# GKE Spot preemption goes through it).
SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
DISRUPTION = {"reason": "TerminationByKubelet", "message": SHUTDOWN_MESSAGE}
# In a namespace labelled so, the agent schedules pods and completes their deletion but starts no containers:
# a test plays the containers there, moving each pod through its phases itself.
CONTAINERS_PLAYED = "sandbox.tpuforge.dev/containers=played-by-test"


class NodeAgent:
    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.api = new_api_client(cfg.kubeconfig)
        self.kube = Kube(self.api)
        self.nodes = {n.name: n for n in emulated_nodes(cfg.pools)}
        self.ctx = AgentContext(
            kube=self.kube,
            pods_dir=cfg.pods_dir,
            claims_dir=cfg.root / "claims",
            apiserver_url=cfg.apiserver_url,
            ca_pem=Pki(cfg.pki).ca_crt.read_bytes(),
            gcs_env=gcs_env(cfg.gcs_url),
        )
        self.runners: dict[str, PodRunner] = {}
        self.terminating: set[str] = set()
        self.preempting: set[str] = set()
        self.unschedulable: dict[str, str] = {}  # uid -> last FailedScheduling message
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.pods = PodCache(self.kube, self.wake.set, self.stopping)
        # Pods this agent bound whose binding its pod view has not shown yet: a pass counts them as placed.
        self.bound: dict[str, str] = {}  # uid -> node

    # -- main loop -------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.register_nodes()
        self.pods.sync()
        threading.Thread(target=self.pods.watch, name="pod-watch", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        serve_logs(
            self.cfg.pods_dir,
            self.stopping,
            self.cfg.ports.node_agent,
            Pki(self.cfg.pki),
            lambda: pod_targets(self.pods.list()),
        )
        log.info("node agent running for %s", ", ".join(self.nodes))
        while not self.stopping.is_set():
            try:
                self.reconcile()
            except Exception:
                log.exception("pass failed; retrying")
                self.stopping.wait(1.0)
            self.wake.wait(PASS_INTERVAL)
            self.wake.clear()
        self.shutdown()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def register_nodes(self) -> None:
        for existing in self.kube.list_nodes(f"{EMULATED_LABEL}=true"):
            if existing["metadata"]["name"] not in self.nodes:
                self.kube.delete_node(existing["metadata"]["name"])  # a pool no longer configured
        for name, node in self.nodes.items():
            self.kube.ensure_node(node.manifest())
            self.kube.patch_node_status(name, node_status(node, now(), self.cfg.ports.node_agent))
            with contextlib.suppress(ApiException):  # a preemption the previous agent did not finish
                self.kube.patch_node(name, {"metadata": {"annotations": {PREEMPT_ANNOTATION: None}}})

    def _heartbeat(self) -> None:
        while not self.stopping.wait(HEARTBEAT_INTERVAL):
            for name, node in self.nodes.items():
                ready = name not in self.preempting
                msg = "node agent is posting ready status" if ready else "node is shutting down (preemption)"
                try:
                    status = node_status(node, now(), self.cfg.ports.node_agent, ready, msg)
                    self.kube.patch_node_status(name, {"conditions": status["conditions"]})
                except Exception as e:
                    log.warning("heartbeat for %s failed: %s", name, e)

    # -- one pass --------------------------------------------------------------------------------------------
    def reconcile(self) -> None:
        pods = with_bindings(self.pods.list(), self.bound)
        played = {n["metadata"]["name"] for n in self.kube.list_namespaces(CONTAINERS_PLAYED)}
        nodes = {
            n["metadata"]["name"]: n
            for n in self.kube.list_nodes(f"{EMULATED_LABEL}=true")
            if n["metadata"]["name"] in self.nodes
        }
        for name, node in nodes.items():
            value = (node["metadata"].get("annotations") or {}).get(PREEMPT_ANNOTATION)
            if value is not None and name not in self.preempting:
                self.preempting.add(name)
                threading.Thread(target=self.preempt, args=(name, value), daemon=True).start()
        live: set[str] = set()
        pending: list[Obj] = []
        for pod in pods:
            meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
            uid = meta["uid"]
            live.add(uid)
            node = spec.get("nodeName")
            if meta.get("deletionTimestamp"):
                if node in self.nodes:
                    self._delete(pod)
                continue
            if not node:
                if status.get("phase", "Pending") == "Pending" and not spec.get("schedulingGates"):
                    pending.append(pod)
                continue
            if node not in self.nodes or uid in self.runners or status.get("phase") in TERMINAL:
                continue
            if meta["namespace"] in played:
                continue
            if status.get("startTime"):
                self._fail_orphan(pod)
                continue
            runner = PodRunner(pod, self.nodes[node], self.ctx)
            self.runners[uid] = runner
            runner.start()
        for uid, runner in list(self.runners.items()):
            if uid in live:
                continue
            if runner.finished.is_set():
                del self.runners[uid]
                runner.cleanup()
                self.terminating.discard(uid)
                self.unschedulable.pop(uid, None)
            elif uid not in self.terminating:  # deleted outright (grace 0): kill at once
                self.terminating.add(uid)
                threading.Thread(target=runner.terminate, args=(0,), daemon=True).start()
        self.terminating &= live | set(self.runners)  # deletions done without a runner (played pods)
        self._schedule(pending, pods, nodes)

    def _schedule(self, pending: list[Obj], pods: list[Obj], nodes: dict[str, Obj]) -> None:
        finished = {uid for uid, r in self.runners.items() if r.finished.is_set()}
        used = tpu_in_use(pods, finished)
        candidates = [nodes[n] for n in sorted(nodes) if n not in self.preempting]
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        for pod in pending:
            meta = pod["metadata"]
            if (pod["spec"].get("schedulerName") or "default-scheduler") != "default-scheduler":
                continue
            exclusive = exclusive_nodes(pod, pods, candidates)
            node, why = pick_node(pod, candidates if exclusive is None else exclusive, used)
            if node is None and exclusive is not None and not exclusive:
                why = f"0/{len(candidates)} nodes are available: no topology domain free for exclusive placement."
            if node is None:
                if self.unschedulable.get(meta["uid"]) != why:
                    self.unschedulable[meta["uid"]] = why
                    cond = {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": why,
                        "lastProbeTime": None,
                        "lastTransitionTime": now(),
                    }
                    self.kube.patch_pod_status(meta["namespace"], meta["name"], {"conditions": [cond]})
                    self.kube.event(pod, "Warning", "FailedScheduling", why, component="default-scheduler")
                continue
            try:
                self.kube.bind(meta["namespace"], meta["name"], node)
            except ApiException as e:
                log.info("binding %s/%s to %s failed: %s", meta["namespace"], meta["name"], node, e.reason)
                continue
            used[node] += tpu_request(pod)
            pod["spec"]["nodeName"] = node  # the next pod of its Job follows it (exclusive placement)
            self.bound[meta["uid"]] = node
            self.unschedulable.pop(meta["uid"], None)
            self.kube.event(
                pod,
                "Normal",
                "Scheduled",
                f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
                component="default-scheduler",
            )

    def _delete(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        if uid in self.terminating:
            return
        self.terminating.add(uid)
        runner = self.runners.get(uid)
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)

        def stop_then_delete() -> None:
            try:
                if runner is not None and not runner.finished.is_set():
                    runner.terminate(float(grace))
                self.kube.delete_pod_now(meta["namespace"], meta["name"], uid)
            except Exception as e:
                log.warning("deleting %s/%s: %s", meta["namespace"], meta["name"], e)
                self.terminating.discard(uid)  # try again next pass

        threading.Thread(target=stop_then_delete, daemon=True).start()

    def _fail_orphan(self, pod: Obj) -> None:
        """A pod a previous agent started: its processes died with that agent and cannot be adopted."""
        meta, status = pod["metadata"], pod.get("status") or {}
        ts = now()
        containers = []
        for cs in status.get("containerStatuses") or []:
            if (cs.get("state") or {}).get("running"):
                cs = {
                    **cs,
                    "ready": False,
                    "state": {
                        "running": None,
                        "waiting": None,
                        "terminated": {
                            "exitCode": 137,
                            "reason": "Error",
                            "startedAt": cs["state"]["running"].get("startedAt"),
                            "finishedAt": ts,
                        },
                    },
                }
            containers.append(cs)
        msg = "the sandbox node agent restarted; it cannot adopt the processes of a pod that was running"
        self.kube.patch_pod_status(
            meta["namespace"],
            meta["name"],
            {
                "phase": "Failed",
                "reason": SHUTDOWN_REASON,
                "message": msg,
                "containerStatuses": containers,
            },
        )

    # -- node shutdown ---------------------------------------------------------------------------------------
    def preempt(self, node: str, annotation: str) -> None:
        """GKE Spot preemption: the node goes NotReady, each pod gets DisruptionTarget, SIGTERM, at most
        15 s (or the annotation's grace), SIGKILL, and ends Failed/Terminated; then the node is back."""
        try:
            grace_cap = float(annotation.split("/", 1)[1]) if "/" in annotation else GKE_SHUTDOWN_GRACE_SECONDS
            spec_node = self.nodes[node]
            msg = "node is shutting down (preemption)"
            self.kube.patch_node_status(
                node,
                {
                    "conditions": node_status(spec_node, now(), self.cfg.ports.node_agent, ready=False, message=msg)[
                        "conditions"
                    ]
                },
            )
            victims = [r for r in list(self.runners.values()) if r.node.name == node and not r.finished.is_set()]
            log.info("preempting %s: %s", node, ", ".join(f"{r.ns}/{r.name}" for r in victims) or "no pods")
            self._shutdown_pods(victims, grace_cap)
            self.kube.patch_node_status(
                node, {"conditions": node_status(spec_node, now(), self.cfg.ports.node_agent)["conditions"]}
            )
            self.kube.patch_node(node, {"metadata": {"annotations": {PREEMPT_ANNOTATION: None}}})
        except Exception:
            log.exception("preempting %s", node)
        finally:
            self.preempting.discard(node)
            self.wake.set()

    def _shutdown_pods(self, runners: list[PodRunner], grace_cap: float) -> None:
        threads = [
            threading.Thread(
                target=r.terminate,
                args=(min(float(r.grace), grace_cap),),
                kwargs={"forced": (SHUTDOWN_REASON, SHUTDOWN_MESSAGE), "disruption": DISRUPTION},
                daemon=True,
            )
            for r in runners
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def shutdown(self) -> None:
        """The agent is stopping (`sandbox down`): a graceful node shutdown of every node."""
        victims = [r for r in self.runners.values() if not r.finished.is_set()]
        log.info("node agent stopping; shutting down %d pod(s)", len(victims))
        self._shutdown_pods(victims, GKE_SHUTDOWN_GRACE_SECONDS)
        for name, node in self.nodes.items():
            with contextlib.suppress(Exception):
                status = node_status(
                    node, now(), self.cfg.ports.node_agent, ready=False, message="the sandbox node agent is stopped"
                )
                self.kube.patch_node_status(name, {"conditions": status["conditions"]})
