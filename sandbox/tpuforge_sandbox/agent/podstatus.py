"""A pod's status as kubelet reports it, and what the node agent's pod runners share: the pod's phase and
conditions, each container's state, the events, and the pods/status patch that publishes them. A pod runner
owns one `PodStatus` and hands it to its containers (`containers.PodContainers`): both change it under its lock."""

from __future__ import annotations

import logging
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from tpuforge_sandbox.agent.attachments import Attachments
from tpuforge_sandbox.agent.dns import LoopbackDns
from tpuforge_sandbox.agent.podenv import PathMap
from tpuforge_sandbox.kubeapi import Kube, now
from tpuforge_sandbox.nodes import EmulatedNode

log = logging.getLogger("tpuforge_sandbox.agent")
Obj = dict[str, Any]


@dataclass
class AgentContext:
    """What every pod runner shares."""

    kube: Kube
    pods_dir: Path
    claims_dir: Path
    apiserver_url: str
    ca_pem: bytes
    gcs_env: dict[str, str]
    attachments: Attachments = field(default_factory=Attachments)
    dns: LoopbackDns = field(default_factory=LoopbackDns)


def states(current: str, value: Obj) -> Obj:
    # Strategic merge keeps keys a patch does not mention: name the other two states with null.
    out: Obj = {"waiting": None, "running": None, "terminated": None}
    out[current] = value
    return out


@dataclass
class ContainerRun:
    spec: Obj
    init: bool
    # A native sidecar (an init container with restartPolicy Always): started in order with the init containers,
    # not waited for, restarted whenever it exits, stopped once the app containers have ended; its exit does
    # not decide the pod's phase.
    sidecar: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    proc: subprocess.Popen[bytes] | None = None
    state: Obj = field(default_factory=lambda: states("waiting", {"reason": "PodInitializing", "message": None}))
    last_state: Obj = field(default_factory=dict)
    restarts: int = 0
    ready: bool = False
    started: bool = False
    exit_code: int | None = None
    container_id: str = ""
    # of the current incarnation, for exec probes
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    paths: PathMap = field(default_factory=lambda: PathMap({}))

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self) -> Obj:
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": self.container_id or None,
            "ready": self.ready,
            "started": self.started if not self.init or self.sidecar else None,
            "restartCount": self.restarts,
            "state": self.state,
            "lastState": self.last_state,
        }


class PodStatus:
    """The pod's phase, conditions and container states, under one lock, and how they reach the API server."""

    def __init__(self, pod: Obj, node: EmulatedNode, ctx: AgentContext) -> None:
        self.pod = pod
        meta, spec = pod["metadata"], pod["spec"]
        self.ns: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.node = node
        self.ctx = ctx
        # 127.0.0.1, except for pods named by hostname.subdomain: each has its own loopback address.
        self.ip: str = ctx.dns.pod_ip(pod)
        pod.setdefault("status", {})["podIP"] = self.ip
        self.inits = [
            ContainerRun(c, True, sidecar=c.get("restartPolicy") == "Always") for c in spec.get("initContainers") or []
        ]
        self.apps = [ContainerRun(c, False) for c in spec.get("containers") or []]
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        self.forced: tuple[str, str] | None = None  # (reason, message) that fails the pod when it ends
        self.conditions: dict[str, Obj] = {}
        self.start_time: str | None = None
        self.lock = threading.RLock()
        self._published: Obj | None = None
        self._events_seen: set[str] = set()

    # -- events and status -------------------------------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str, once: bool = False) -> None:
        if once:
            if message in self._events_seen:
                return
            self._events_seen.add(message)
        self.ctx.kube.event(self.pod, type_, reason, message, host=self.node.name)

    def set_condition(self, type_: str, status: bool, reason: str | None = None, message: str | None = None) -> None:
        value = "True" if status else "False"
        old = self.conditions.get(type_)
        changed = old is None or old["status"] != value
        self.conditions[type_] = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": now() if changed else old["lastTransitionTime"],  # type: ignore[index]
        }

    def update_ready(self) -> None:
        unready = [c.name for c in self.apps if not c.ready]
        if unready:
            msg = f"containers with unready status: [{' '.join(unready)}]"
            self.set_condition("ContainersReady", False, "ContainersNotReady", msg)
            self.set_condition("Ready", False, "ContainersNotReady", msg)
        else:
            self.set_condition("ContainersReady", True)
            self.set_condition("Ready", True)

    def finish(self) -> None:
        """The pod has ended: its phase from the containers' exits (or the reason it was forced to fail)."""
        with self.lock:
            for c in self.inits + self.apps:
                if c.state.get("running"):  # only when the agent itself failed mid-run
                    c.state = states(
                        "terminated",
                        {
                            "exitCode": 137 if c.exit_code is None else c.exit_code,
                            "signal": None,
                            "reason": "Error",
                            "message": None,
                            "startedAt": None,
                            "finishedAt": now(),
                            "containerID": c.container_id or None,
                        },
                    )
                c.ready = c.started = False
            if self.forced:
                self.phase, (self.reason, self.message) = "Failed", self.forced
            elif any(c.exit_code != 0 for c in self.inits if not c.sidecar):
                self.phase = "Failed"
            elif self.apps and all(c.exit_code == 0 for c in self.apps):
                self.phase = "Succeeded"
            else:
                self.phase = "Failed"
            self.set_condition("ContainersReady", False, "PodCompleted")
            self.set_condition("Ready", False, "PodCompleted")
        self.publish()

    def status(self) -> Obj:
        with self.lock:
            return {
                "phase": self.phase,
                "reason": self.reason,
                "message": self.message,
                "hostIP": "127.0.0.1",
                "podIP": self.ip,
                "podIPs": [{"ip": self.ip}],
                "startTime": self.start_time,
                "conditions": [dict(c) for c in self.conditions.values()],
                "initContainerStatuses": [c.status() for c in self.inits] or None,
                "containerStatuses": [c.status() for c in self.apps],
            }

    def publish(self) -> None:
        """Patch pods/status when it changed (strategic merge: conditions merge by type, so a condition
        someone else set stays)."""
        with self.lock:
            status = self.status()
            if status == self._published:
                return
            try:
                self.ctx.kube.patch_pod_status(self.ns, self.name, status)
            except ApiException as e:
                log.warning("status of %s/%s not patched: %s %s", self.ns, self.name, e.status, e.reason)
                return
            self._published = status
