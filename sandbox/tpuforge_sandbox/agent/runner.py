"""The kubelet's part of the node agent for one pod, from start to end: its directory, volumes and kubeconfig
(waiting, like kubelet, for missing ConfigMaps, Secrets and disks), init containers in order, then the app
containers (run as local process groups with restarts and probes: containers.py), its active deadline, its
termination, and the final pod status that says so (podstatus.py)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import threading

from kubernetes.client.exceptions import ApiException

from tpuforge_sandbox.agent.containers import CONFIG_RETRY, PodContainers
from tpuforge_sandbox.agent.podenv import ConfigError
from tpuforge_sandbox.agent.podstatus import AgentContext, ContainerRun, Obj, PodStatus, states
from tpuforge_sandbox.agent.runtimes import runtime_for
from tpuforge_sandbox.agent.volumes import materialise
from tpuforge_sandbox.controlplane import kubeconfig_yaml
from tpuforge_sandbox.kubeapi import now
from tpuforge_sandbox.nodes import EmulatedNode

log = logging.getLogger("tpuforge_sandbox.agent")


class PodRunner:
    """One pod on its node: a thread of its own runs it from start to final status; terminate stops it. It owns
    the pod's status (`PodStatus`) and its containers (`PodContainers`, which report into that status)."""

    def __init__(self, pod: Obj, node: EmulatedNode, ctx: AgentContext) -> None:
        self.pod_status = PodStatus(pod, node, ctx)
        self.containers = PodContainers(self.pod_status)
        self.pod, self.node, self.ctx = pod, node, ctx
        self.ns, self.name, self.uid = self.pod_status.ns, self.pod_status.name, self.pod_status.uid
        self.grace = self.containers.grace
        self.dir = self.containers.dir
        self.stopping = self.containers.stopping
        self.finished = threading.Event()
        self.terminating = False
        self.thread = threading.Thread(target=self._main, name=f"pod {self.ns}/{self.name}", daemon=True)

    # -- public ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def terminate(self, grace: float, forced: tuple[str, str] | None = None, disruption: Obj | None = None) -> None:
        """Stop the pod: no more (re)starts, SIGTERM to every container's process group, SIGKILL after
        `grace` seconds. Blocks until the pod's final status is published."""
        with self.pod_status.lock:
            self.terminating = True
            if forced and self.pod_status.forced is None:
                self.pod_status.forced = forced
            if disruption:
                self.pod_status.set_condition("DisruptionTarget", True, disruption["reason"], disruption["message"])
        self.pod_status.publish()
        self.stopping.set()
        running = [c for c in self.pod_status.inits + self.pod_status.apps if c.proc is not None]
        if running:
            self.pod_status.event(
                "Normal",
                "Killing",
                f"Stopping container{'s' if len(running) > 1 else ''} {', '.join(c.name for c in running)}",
            )
        self.containers.signal_all(signal.SIGTERM)
        if not self.finished.wait(max(0.0, grace)):
            self.containers.signal_all(signal.SIGKILL)
            self.finished.wait(30)

    def cleanup(self) -> None:
        """The pod object is gone: free its volumes, scratch space and address, keep its logs."""
        self.ctx.dns.release(self.uid)
        shutil.rmtree(self.containers.tmp_dir, ignore_errors=True)
        for sub in ("volumes", "work", "rootfs", "containers", "kubeconfig"):
            path = self.dir / sub
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    # -- the pod's life ----------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except Exception as e:  # the agent must survive any one pod
            log.exception("pod %s/%s", self.ns, self.name)
            with self.pod_status.lock:
                why = ("NodeAgentError", f"the sandbox node agent failed to run this pod: {e}")
                self.pod_status.forced = self.pod_status.forced or why
        finally:
            self.ctx.attachments.release(self.uid)
            with contextlib.suppress(Exception):
                self.pod_status.finish()
            with contextlib.suppress(OSError):
                (self.dir / "logs" / ".done").touch()
            self.finished.set()

    def _run(self) -> None:
        spec = self.pod["spec"]
        with self.pod_status.lock:
            self.pod_status.start_time = now()
            self.pod_status.set_condition(
                "Initialized",
                not self.pod_status.inits,
                *(
                    ()
                    if not self.pod_status.inits
                    else (
                        "ContainersNotInitialized",
                        f"containers with incomplete status: [{' '.join(c.name for c in self.pod_status.inits)}]",
                    )
                ),
            )
            self.pod_status.update_ready()
        self.pod_status.publish()
        for c in self.pod_status.inits + self.pod_status.apps:
            missing = runtime_for(c.spec.get("image", "")).error
            if missing:
                self._cannot_start(c, "ImageUnavailable", missing)
                return
            if not c.spec.get("command"):
                msg = (
                    f"container {c.name} has no command: the sandbox runs processes, not images, so "
                    "it cannot use the image's entrypoint; set `command` in the pod spec"
                )
                self._cannot_start(c, "StartError", msg)
                return
        if not self._prepare():
            return
        if spec.get("activeDeadlineSeconds"):
            deadline = float(spec["activeDeadlineSeconds"])
            threading.Thread(target=self._deadline, args=(deadline,), daemon=True).start()
        sidecars: list[tuple[ContainerRun, threading.Thread]] = []
        try:
            for c in self.pod_status.inits:
                if c.sidecar:
                    sidecars.append((c, self._start_sidecar(c)))
                elif not self.containers.run(c):
                    return
            self._run_apps()
        finally:
            for c, thread in reversed(sidecars):  # in the reverse of their start, as kubelet
                self.containers.stop_sidecar(c, thread)

    def _start_sidecar(self, c: ContainerRun) -> threading.Thread:
        """A native sidecar: started, then the next container starts once it runs (or has ended)."""
        thread = threading.Thread(target=self.containers.run, args=(c,), daemon=True, name=f"{self.name}/{c.name}")
        thread.start()
        while c.proc is None and thread.is_alive() and not self.stopping.is_set():
            self.stopping.wait(0.05)
        return thread

    def _run_apps(self) -> None:
        with self.pod_status.lock:
            if self.pod_status.inits:
                self.pod_status.set_condition("Initialized", True)
            for c in self.pod_status.apps:
                c.state = states("waiting", {"reason": "ContainerCreating", "message": None})
        self.pod_status.publish()
        threads = [threading.Thread(target=self.containers.run, args=(c,), daemon=True) for c in self.pod_status.apps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _deadline(self, seconds: float) -> None:
        if not self.stopping.wait(seconds):
            message = "Pod was active on the node longer than the specified deadline"
            self.pod_status.event("Warning", "DeadlineExceeded", message)
            self.terminate(self.grace, forced=("DeadlineExceeded", message))

    def _cannot_start(self, c: ContainerRun, reason: str, message: str) -> None:
        with self.pod_status.lock:
            c.state = states(
                "terminated",
                {
                    "exitCode": 128,
                    "signal": None,
                    "reason": reason,
                    "message": message,
                    "startedAt": None,
                    "finishedAt": now(),
                    "containerID": None,
                },
            )
            c.exit_code = 128
            self.pod_status.forced = (reason, message)
        self.pod_status.event("Warning", "Failed", message)

    def _prepare(self) -> bool:
        """Pod directory, volumes and kubeconfig; waits (like kubelet) for missing ConfigMaps/Secrets."""
        while not self.stopping.is_set():
            try:
                self._prepare_once()
                return True
            except ConfigError as e:
                # A disk that cannot attach yet leaves the containers as kubelet shows them: still being
                # created; the reason is in the event.
                waiting = {"reason": "ContainerCreating"} if e.reason == "FailedAttachVolume" else None
                with self.pod_status.lock:
                    for c in self.pod_status.inits + self.pod_status.apps:
                        c.state = states("waiting", waiting or {"reason": e.reason, "message": e.message})
                self.pod_status.publish()
                reason = e.reason if e.reason in ("FailedMount", "FailedAttachVolume") else "Failed"
                self.pod_status.event("Warning", reason, e.message, once=True)
                self.stopping.wait(CONFIG_RETRY)
        return False

    def _prepare_once(self) -> None:
        uid_file = self.dir / "uid"
        if self.dir.exists() and (not uid_file.exists() or uid_file.read_text() != self.uid):
            shutil.rmtree(self.dir)  # a previous pod of the same name
        for sub in ("logs", "work", "containers"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.containers.tmp_dir, ignore_errors=True)
        self.containers.tmp_dir.mkdir(parents=True)
        uid_file.write_text(self.uid)
        (self.dir / "logs" / ".done").unlink(missing_ok=True)
        spec = self.pod["spec"]
        sa = spec.get("serviceAccountName") or "default"

        def token(audience: str | None, expiration: int | None) -> str:
            try:
                return self.ctx.kube.service_account_token(self.ns, sa, self.pod, audience, expiration)
            except ApiException as e:
                raise ConfigError("FailedMount", f"token for ServiceAccount {sa}: {e.status} {e.reason}") from None

        self._attach_claims()
        vols = materialise(self.pod, self.dir, self.ctx.claims_dir, self.containers.lookup, token)
        for w in vols.warnings:
            self.pod_status.event("Warning", "VolumeEmulated", w, once=True)
        self.containers.volumes = vols.paths
        if spec.get("automountServiceAccountToken", True) is not False:
            kc = self.dir / "kubeconfig"
            kc.write_text(
                kubeconfig_yaml(self.ctx.apiserver_url, self.ctx.ca_pem, token(None, None), namespace=self.ns)
            )
            kc.chmod(0o600)
            self.containers.kubeconfig = kc

    def _attach_claims(self) -> None:
        """Attach the pod's PersistentVolumeClaims to its node, or wait like a pod whose disk is attached to
        another node (ReadWriteOnce)."""
        names = [
            v["persistentVolumeClaim"]["claimName"]
            for v in self.pod["spec"].get("volumes") or []
            if "persistentVolumeClaim" in v
        ]
        claims: dict[str, list[str]] = {}
        for name in names:
            claim = self.ctx.kube.read_pvc(self.ns, name)
            if claim is None:
                raise ConfigError("FailedMount", f'persistentvolumeclaim "{name}" not found')
            claims[name] = list((claim.get("spec") or {}).get("accessModes") or [])
        refused = self.ctx.attachments.attach(self.ns, claims, self.uid, self.name, self.node.name)
        if refused is not None:
            raise ConfigError("FailedAttachVolume", refused)
