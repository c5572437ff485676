"""The kubelet's part of the node agent for one pod: volumes, environment, init containers in order, then the
app containers as local process groups, probes, restarts, termination, and the pod status that says so."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from tpuforge.sandbox.agent.attachments import Attachments
from tpuforge.sandbox.agent.jobsets import COMPLETION_INDEX, LOOPBACK_IP, pod_hostname, rewrite_addresses
from tpuforge.sandbox.agent.podenv import ConfigError, PathMap, container_env, expand
from tpuforge.sandbox.agent.probes import run_probe
from tpuforge.sandbox.agent.runtimes import runtime_for
from tpuforge.sandbox.agent.volumes import materialise
from tpuforge.sandbox.controlplane import kubeconfig_yaml
from tpuforge.sandbox.kubeapi import Kube, now
from tpuforge.sandbox.nodes import EmulatedNode
from tpuforge.sandbox.procs import pdeathsig

log = logging.getLogger("tpuforge.sandbox.agent")
Obj = dict[str, Any]

# kubelet backs off 10 s doubling to 5 min; a laptop sandbox wants quicker feedback.
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
BACKOFF_RESET_AFTER = 600.0
CONFIG_RETRY = 2.0
MESSAGE_MAX = 4096  # kubelet's limit on a termination message file
FALLBACK_BYTES, FALLBACK_LINES = 2048, 80  # what FallbackToLogsOnError takes from the log
# Variables a container inherits from the agent's environment (a container image would set its own).
INHERITED_ENV = (
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    # A persistent XLA compilation cache, when the agent's caller has one (tests, the demo): training pods
    # then compile each program once per machine, as a trainer image with a cache volume would.
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
    # A checkout run from its source roots (a second working tree) gives its pods the same code.
    "PYTHONPATH",
)
# The trainer's metrics server binds the pod's address; on a laptop every server listens on loopback only.
METRICS_ADDR = "TPUFORGE_METRICS_ADDR"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _states(current: str, value: Obj) -> Obj:
    # Strategic merge keeps keys a patch does not mention: name the other two states with null.
    out: Obj = {"waiting": None, "running": None, "terminated": None}
    out[current] = value
    return out


@dataclass
class ContainerRun:
    spec: Obj
    init: bool
    proc: subprocess.Popen[bytes] | None = None
    state: Obj = field(default_factory=lambda: _states("waiting", {"reason": "PodInitializing", "message": None}))
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
            "started": self.started if not self.init else None,
            "restartCount": self.restarts,
            "state": self.state,
            "lastState": self.last_state,
        }


class PodRunner:
    def __init__(self, pod: Obj, node: EmulatedNode, ctx: AgentContext) -> None:
        self.pod = pod
        meta, spec = pod["metadata"], pod["spec"]
        self.ns: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.node = node
        self.ctx = ctx
        self.dir: Path = ctx.pods_dir / self.ns / self.name
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.grace = int(spec.get("terminationGracePeriodSeconds", 30))
        # 127.0.0.1, except for a JobSet's pods after its first: each has its own loopback address.
        self.ip: str = (meta.get("annotations") or {}).get(LOOPBACK_IP) or "127.0.0.1"
        self.inits = [ContainerRun(c, True) for c in spec.get("initContainers") or []]
        self.apps = [ContainerRun(c, False) for c in spec.get("containers") or []]
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        self.forced: tuple[str, str] | None = None  # (reason, message) that fails the pod when it ends
        self.conditions: dict[str, Obj] = {}
        self.start_time: str | None = None
        self.volumes: dict[str, Path] = {}
        self.kubeconfig: Path | None = None
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.terminating = False
        self._lock = threading.RLock()
        self._published: Obj | None = None
        self._events_seen: set[str] = set()
        self.thread = threading.Thread(target=self._main, name=f"pod {self.ns}/{self.name}", daemon=True)

    # -- public ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def log_path(self, container: str) -> Path:
        return self.dir / "logs" / f"{container}.log"

    def terminate(self, grace: float, forced: tuple[str, str] | None = None, disruption: Obj | None = None) -> None:
        """Stop the pod: no more (re)starts, SIGTERM to every container's process group, SIGKILL after
        `grace` seconds. Blocks until the pod's final status is published."""
        with self._lock:
            self.terminating = True
            if forced and self.forced is None:
                self.forced = forced
            if disruption:
                self._set_condition("DisruptionTarget", True, disruption["reason"], disruption["message"])
        self.publish()
        self.stopping.set()
        running = [c for c in self.inits + self.apps if c.proc is not None]
        if running:
            self.event(
                "Normal",
                "Killing",
                f"Stopping container{'s' if len(running) > 1 else ''} {', '.join(c.name for c in running)}",
            )
        self._signal_all(signal.SIGTERM)
        if not self.finished.wait(max(0.0, grace)):
            self._signal_all(signal.SIGKILL)
            self.finished.wait(30)

    @property
    def tmp_dir(self) -> Path:
        """The pod's TMPDIR. Short and outside the pod directory: programs put Unix sockets there (vLLM's
        ZMQ IPC), whose paths may not exceed 107 bytes, and pod directories under a test's temp dir do."""
        digest = hashlib.sha1(str(self.dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / "tpf" / digest

    def cleanup(self) -> None:
        """The pod object is gone: free its volumes and scratch space, keep its logs."""
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        for sub in ("volumes", "work", "rootfs", "containers", "kubeconfig"):
            path = self.dir / sub
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def event(self, type_: str, reason: str, message: str, once: bool = False) -> None:
        if once:
            if message in self._events_seen:
                return
            self._events_seen.add(message)
        self.ctx.kube.event(self.pod, type_, reason, message, host=self.node.name)

    # -- the pod's life ----------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except Exception as e:  # the agent must survive any one pod
            log.exception("pod %s/%s", self.ns, self.name)
            with self._lock:
                self.forced = self.forced or ("NodeAgentError", f"the sandbox node agent failed to run this pod: {e}")
        finally:
            self.ctx.attachments.release(self.uid)
            with contextlib.suppress(Exception):
                self._finish()
            with contextlib.suppress(OSError):
                (self.dir / "logs" / ".done").touch()
            self.finished.set()

    def _run(self) -> None:
        spec = self.pod["spec"]
        with self._lock:
            self.start_time = now()
            self._set_condition(
                "Initialized",
                not self.inits,
                *(
                    ()
                    if not self.inits
                    else (
                        "ContainersNotInitialized",
                        f"containers with incomplete status: [{' '.join(c.name for c in self.inits)}]",
                    )
                ),
            )
            self._update_ready()
        self.publish()
        for c in self.inits + self.apps:
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
        for c in self.inits:
            if not self._run_container(c):
                return
        with self._lock:
            if self.inits:
                self._set_condition("Initialized", True)
            for c in self.apps:
                c.state = _states("waiting", {"reason": "ContainerCreating", "message": None})
        self.publish()
        threads = [threading.Thread(target=self._run_container, args=(c,), daemon=True) for c in self.apps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _deadline(self, seconds: float) -> None:
        if not self.stopping.wait(seconds):
            self.event("Warning", "DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
            self.terminate(
                self.grace, forced=("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
            )

    def _cannot_start(self, c: ContainerRun, reason: str, message: str) -> None:
        with self._lock:
            c.state = _states(
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
            self.forced = (reason, message)
        self.event("Warning", "Failed", message)

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
                with self._lock:
                    for c in self.inits + self.apps:
                        c.state = _states("waiting", waiting or {"reason": e.reason, "message": e.message})
                self.publish()
                reason = e.reason if e.reason in ("FailedMount", "FailedAttachVolume") else "Failed"
                self.event("Warning", reason, e.message, once=True)
                self.stopping.wait(CONFIG_RETRY)
        return False

    def _prepare_once(self) -> None:
        uid_file = self.dir / "uid"
        if self.dir.exists() and (not uid_file.exists() or uid_file.read_text() != self.uid):
            shutil.rmtree(self.dir)  # a previous pod of the same name
        for sub in ("logs", "work", "containers"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir.mkdir(parents=True)
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
        vols = materialise(self.pod, self.dir, self.ctx.claims_dir, self._lookup, token)
        for w in vols.warnings:
            self.event("Warning", "VolumeEmulated", w, once=True)
        self.volumes = vols.paths
        if spec.get("automountServiceAccountToken", True) is not False:
            kc = self.dir / "kubeconfig"
            kc.write_text(
                kubeconfig_yaml(self.ctx.apiserver_url, self.ctx.ca_pem, token(None, None), namespace=self.ns)
            )
            kc.chmod(0o600)
            self.kubeconfig = kc

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

    def _lookup(self, kind: str, name: str) -> dict[str, bytes] | None:
        return self.ctx.kube.key_data(self.ns, kind, name)

    # -- one container ------------------------------------------------------------------------------------
    def _path_map(self, c: ContainerRun) -> PathMap:
        mapping: dict[str, str] = {}
        for m in c.spec.get("volumeMounts") or []:
            host = self.volumes.get(m["name"])
            if host is None:
                continue
            if m.get("subPath"):
                host = host / m["subPath"]
                if not host.exists():
                    host.mkdir(parents=True, exist_ok=True)
            mapping[m["mountPath"]] = str(host)
        tm = c.spec.get("terminationMessagePath") or "/dev/termination-log"
        mapping[tm] = str(self._termination_file(c))
        return PathMap(mapping)

    def _termination_file(self, c: ContainerRun) -> Path:
        return self.dir / "containers" / c.name / "termination-log"

    def _environment(self, c: ContainerRun, paths: PathMap) -> dict[str, str]:
        """The agent's values are host paths already; only the pod spec's own values are container paths to
        map. (A pod that mounts a volume at /tmp must not have the agent's TMPDIR or kubeconfig, which may
        live under the host's /tmp, rewritten into that volume.)"""
        runtime = runtime_for(c.spec.get("image", ""))
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env.update(
            {
                "HOSTNAME": pod_hostname(self.pod) or self.name,
                "TMPDIR": str(self.tmp_dir),
                **runtime.env,
                # Python images set this; without it, logs arrive only when the process exits.
                "PYTHONUNBUFFERED": "1",
                METRICS_ADDR: self.ip,
                **self.ctx.gcs_env,
            }
        )
        if self.kubeconfig:
            env["KUBECONFIG"] = str(self.kubeconfig)
        index = (self.pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX)
        if index is not None:  # what the Indexed Job controller adds to every container
            env["JOB_COMPLETION_INDEX"] = index
        own = container_env(self.pod, c.spec, self._lookup, self.node.resources())
        env.update({k: paths.apply(v) for k, v in own.items()})
        env = {k: rewrite_addresses(v, self.pod) for k, v in env.items()}  # the sandbox's DNS
        env["PATH"] = f"{runtime.bin_dir}:{env.get('PATH') or SYSTEM_PATH}"
        if self.node.tpu:
            # One emulated CPU device per TPU chip of the node, so meshes keep their TPU shape.
            flag = f"--xla_force_host_platform_device_count={self.node.chips}"
            env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} {flag}" if env.get("XLA_FLAGS") else flag
            env["JAX_PLATFORMS"] = "cpu"
        return env

    def _spawn(self, c: ContainerRun) -> subprocess.Popen[bytes]:
        paths = self._path_map(c)
        env = self._environment(c, paths)
        # Map the spec's text before expanding $(VAR): the values substituted are mapped already.
        argv = [expand(paths.apply(str(a)), env) for a in (c.spec.get("command") or []) + (c.spec.get("args") or [])]
        cwd = self.dir / "work"
        if c.spec.get("workingDir"):
            mapped = paths.apply(c.spec["workingDir"])
            cwd = Path(mapped) if mapped != c.spec["workingDir"] else self.dir / "rootfs" / mapped.lstrip("/")
            cwd.mkdir(parents=True, exist_ok=True)
        term = self._termination_file(c)
        term.parent.mkdir(parents=True, exist_ok=True)
        term.write_bytes(b"")
        c.env, c.cwd, c.paths = env, str(cwd), paths
        with open(self.log_path(c.name), "ab") as out:
            return subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach its children too
                preexec_fn=pdeathsig(signal.SIGKILL),  # nothing outlives a killed agent
                close_fds=True,
            )

    def _run_container(self, c: ContainerRun) -> bool:
        """Run `c` until it ends for good under the restart policy; True when it last exited 0."""
        backoff = BACKOFF_START
        while not self.stopping.is_set():
            log_offset = self.log_path(c.name).stat().st_size if self.log_path(c.name).exists() else 0
            started_at, t0 = now(), time.monotonic()
            try:
                proc = self._spawn(c)
            except ConfigError as e:
                with self._lock:
                    c.state = _states("waiting", {"reason": e.reason, "message": e.message})
                self.publish()
                self.event("Warning", "Failed", f"Error: {e.message}", once=True)
                self.stopping.wait(CONFIG_RETRY)
                continue
            except OSError as e:
                rc, message, reason = 128, f"failed to start {c.name}: {e}", "StartError"
                self.event("Warning", "Failed", message)
            else:
                with self._lock:
                    c.proc = proc
                    c.container_id = f"sandbox://{self.uid[:8]}/{c.name}/{c.restarts}"
                    c.state = _states("running", {"startedAt": started_at})
                    c.started = not c.spec.get("startupProbe")
                    c.ready = c.init or not (c.spec.get("readinessProbe") or c.spec.get("startupProbe"))
                    if not c.init:
                        self.phase = "Running"
                    self._update_ready()
                self.publish()
                self.event("Normal", "Started", f"Started container {c.name}")
                if not c.init and any(c.spec.get(p) for p in ("startupProbe", "readinessProbe", "livenessProbe")):
                    threading.Thread(target=self._probe_loop, args=(c, proc), daemon=True).start()
                rc = _exit_code(proc.wait())
                _killpg(proc.pid, signal.SIGKILL)  # whatever the container left behind in its group
                reason = "Completed" if rc == 0 else "Error"
                message = self._termination_message(c, rc, log_offset)
            with self._lock:
                c.proc = None
                c.exit_code = rc
                c.ready = c.started = False
                c.state = _states(
                    "terminated",
                    {
                        "exitCode": rc,
                        "signal": None,
                        "reason": reason,
                        "message": message or None,
                        "startedAt": started_at,
                        "finishedAt": now(),
                        "containerID": c.container_id or None,
                    },
                )
                self._update_ready()
            self.publish()
            if self.stopping.is_set():
                break
            if c.init:
                restart = rc != 0 and self.restart_policy != "Never"
            else:
                restart = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and rc != 0)
            if not restart:
                break
            if time.monotonic() - t0 > BACKOFF_RESET_AFTER:
                backoff = BACKOFF_START
            msg = f"back-off {backoff:.0f}s restarting failed container={c.name} pod={self.name}"
            with self._lock:
                c.last_state = c.state
                c.state = _states("waiting", {"reason": "CrashLoopBackOff", "message": msg})
            self.publish()
            self.event("Warning", "BackOff", f"Back-off restarting failed container {c.name}")
            if self.stopping.wait(backoff):
                break
            c.restarts += 1
            backoff = min(backoff * 2, BACKOFF_MAX)
        return c.exit_code == 0

    def _termination_message(self, c: ContainerRun, rc: int, log_offset: int) -> str:
        try:
            with open(self._termination_file(c), "rb") as f:
                text = f.read(MESSAGE_MAX).decode(errors="replace")
        except OSError:
            text = ""
        if text.strip() or rc == 0 or c.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return text
        try:
            with open(self.log_path(c.name), "rb") as f:
                f.seek(log_offset)
                tail = f.read()[-FALLBACK_BYTES:]
        except OSError:
            return ""
        return "\n".join(tail.decode(errors="replace").splitlines()[-FALLBACK_LINES:])

    def _signal_all(self, sig: int) -> None:
        for c in self.inits + self.apps:
            proc = c.proc
            if proc is not None:
                _killpg(proc.pid, sig)

    def _kill_container(self, c: ContainerRun, proc: subprocess.Popen[bytes], why: str) -> None:
        self.event("Normal", "Killing", f"Container {c.name} {why}, will be restarted")
        _killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self.grace)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)

    # -- probes ---------------------------------------------------------------------------------------------
    def _exec_probe(self, c: ContainerRun, command: list[str], timeout: float) -> int:
        argv = [expand(c.paths.apply(a), c.env) for a in command]
        return subprocess.run(argv, env=c.env, cwd=c.cwd, capture_output=True, timeout=timeout, check=False).returncode

    def _probe_loop(self, c: ContainerRun, proc: subprocess.Popen[bytes]) -> None:
        spec = c.spec
        t0 = time.monotonic()
        probes = {k: spec[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if spec.get(k)}
        due = {k: t0 + float(p.get("initialDelaySeconds") or 0) for k, p in probes.items()}
        ok_n = dict.fromkeys(probes, 0)
        fail_n = dict.fromkeys(probes, 0)
        while proc.poll() is None and not self.stopping.is_set():
            active = [k for k in probes if k == "startupProbe" or c.started]
            active = [k for k in active if not (k == "startupProbe" and c.started)]
            if not active:
                self.stopping.wait(0.5)
                continue
            kind = min(active, key=lambda k: due[k])
            if self.stopping.wait(max(0.0, due[kind] - time.monotonic())):
                return
            if proc.poll() is not None:
                return
            probe = probes[kind]
            due[kind] = time.monotonic() + float(probe.get("periodSeconds") or 10)
            ok, msg = run_probe(probe, spec, lambda cmd, t: self._exec_probe(c, cmd, t), host=self.ip)
            if ok:
                ok_n[kind] += 1
                fail_n[kind] = 0
            else:
                fail_n[kind] += 1
                ok_n[kind] = 0
                label = {"startupProbe": "Startup", "readinessProbe": "Readiness", "livenessProbe": "Liveness"}[kind]
                self.event("Warning", "Unhealthy", f"{label} probe failed: {msg}")
            success_needed = int(probe.get("successThreshold") or 1)
            failures_allowed = int(probe.get("failureThreshold") or 3)
            changed = False
            with self._lock:
                if kind == "startupProbe" and ok_n[kind] >= success_needed:
                    c.started = True
                    c.ready = not spec.get("readinessProbe")
                    changed = True
                elif kind == "readinessProbe":
                    if ok_n[kind] >= success_needed and not c.ready:
                        c.ready, changed = True, True
                    elif fail_n[kind] >= failures_allowed and c.ready:
                        c.ready, changed = False, True
                if changed:
                    self._update_ready()
            if changed:
                self.publish()
            if kind in ("startupProbe", "livenessProbe") and fail_n[kind] >= failures_allowed:
                what = "failed startup probe" if kind == "startupProbe" else "failed liveness probe"
                self._kill_container(c, proc, what)
                return

    # -- status -----------------------------------------------------------------------------------------------
    def _set_condition(self, type_: str, status: bool, reason: str | None = None, message: str | None = None) -> None:
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

    def _update_ready(self) -> None:
        unready = [c.name for c in self.apps if not c.ready]
        if unready:
            msg = f"containers with unready status: [{' '.join(unready)}]"
            self._set_condition("ContainersReady", False, "ContainersNotReady", msg)
            self._set_condition("Ready", False, "ContainersNotReady", msg)
        else:
            self._set_condition("ContainersReady", True)
            self._set_condition("Ready", True)

    def _finish(self) -> None:
        with self._lock:
            for c in self.inits + self.apps:
                if c.state.get("running"):  # only when the agent itself failed mid-run
                    c.state = _states(
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
            elif any(c.exit_code != 0 for c in self.inits):
                self.phase = "Failed"
            elif self.apps and all(c.exit_code == 0 for c in self.apps):
                self.phase = "Succeeded"
            else:
                self.phase = "Failed"
            self._set_condition("ContainersReady", False, "PodCompleted")
            self._set_condition("Ready", False, "PodCompleted")
        self.publish()

    def status(self) -> Obj:
        with self._lock:
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
        with self._lock:
            status = self.status()
            if status == self._published:
                return
            try:
                self.ctx.kube.patch_pod_status(self.ns, self.name, status)
            except ApiException as e:
                log.warning("status of %s/%s not patched: %s %s", self.ns, self.name, e.status, e.reason)
                return
            self._published = status
