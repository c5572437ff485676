"""The pod's containers as local process groups, as kubelet runs them: each one's environment and command
line mapped onto the host, spawned, waited for, restarted under the pod's restart policy with back-off, killed,
its termination message read; and its startup, readiness and liveness probes."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tpuforge_sandbox.agent.dns import pod_hostname
from tpuforge_sandbox.agent.podenv import ConfigError, PathMap, container_env, expand
from tpuforge_sandbox.agent.podstatus import ContainerRun, PodStatus, states
from tpuforge_sandbox.agent.probes import run_probe
from tpuforge_sandbox.agent.runtimes import runtime_for
from tpuforge_sandbox.kubeapi import now
from tpuforge_sandbox.procs import pdeathsig

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


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class PodContainers:
    """The pod's directory, its containers' processes and their probes; what they do shows in `status`, the
    pod's status its runner owns."""

    def __init__(self, status: PodStatus) -> None:
        self.status = status
        # Who the pod is, for paths, events and the environment (they never change).
        self.pod, self.node, self.ctx = status.pod, status.node, status.ctx
        self.ns, self.name, self.uid = status.ns, status.name, status.uid
        spec = self.pod["spec"]
        self.dir: Path = self.ctx.pods_dir / self.ns / self.name
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.grace = int(spec.get("terminationGracePeriodSeconds", 30))
        self.volumes: dict[str, Path] = {}
        self.kubeconfig: Path | None = None
        self.stopping = threading.Event()

    def log_path(self, container: str) -> Path:
        return self.dir / "logs" / f"{container}.log"

    @property
    def tmp_dir(self) -> Path:
        """The pod's TMPDIR. Short and outside the pod directory: programs put Unix sockets there (vLLM's
        ZMQ IPC), whose paths may not exceed 107 bytes, and pod directories under a test's temp dir do."""
        digest = hashlib.sha1(str(self.dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / "tpf" / digest

    def lookup(self, kind: str, name: str) -> dict[str, bytes] | None:
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
                METRICS_ADDR: self.status.ip,
                **self.ctx.gcs_env,
            }
        )
        if self.kubeconfig:
            env["KUBECONFIG"] = str(self.kubeconfig)
        own = container_env(self.pod, c.spec, self.lookup, self.node.resources())
        env.update({k: paths.apply(v) for k, v in own.items()})
        env = {k: self.ctx.dns.rewrite(v, self.pod) for k, v in env.items()}  # the sandbox's DNS
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

    def run(self, c: ContainerRun) -> bool:
        """Run `c` until it ends for good under the restart policy; True when it last exited 0."""
        backoff = BACKOFF_START
        while not self.stopping.is_set() and not c.stop.is_set():
            log_offset = self.log_path(c.name).stat().st_size if self.log_path(c.name).exists() else 0
            started_at, t0 = now(), time.monotonic()
            try:
                proc = self._spawn(c)
            except ConfigError as e:
                with self.status.lock:
                    c.state = states("waiting", {"reason": e.reason, "message": e.message})
                self.status.publish()
                self.status.event("Warning", "Failed", f"Error: {e.message}", once=True)
                self.stopping.wait(CONFIG_RETRY)
                continue
            except OSError as e:
                rc, message, reason = 128, f"failed to start {c.name}: {e}", "StartError"
                self.status.event("Warning", "Failed", message)
            else:
                with self.status.lock:
                    c.proc = proc
                    c.container_id = f"sandbox://{self.uid[:8]}/{c.name}/{c.restarts}"
                    c.state = states("running", {"startedAt": started_at})
                    c.started = not c.spec.get("startupProbe")
                    c.ready = c.init or not (c.spec.get("readinessProbe") or c.spec.get("startupProbe"))
                    if not c.init:
                        self.status.phase = "Running"
                    self.status.update_ready()
                self.status.publish()
                self.status.event("Normal", "Started", f"Started container {c.name}")
                if not c.init and any(c.spec.get(p) for p in ("startupProbe", "readinessProbe", "livenessProbe")):
                    threading.Thread(target=self._probe_loop, args=(c, proc), daemon=True).start()
                rc = _exit_code(proc.wait())
                _killpg(proc.pid, signal.SIGKILL)  # whatever the container left behind in its group
                reason = "Completed" if rc == 0 else "Error"
                message = self._termination_message(c, rc, log_offset)
            with self.status.lock:
                c.proc = None
                c.exit_code = rc
                c.ready = c.started = False
                c.state = states(
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
                self.status.update_ready()
            self.status.publish()
            if self.stopping.is_set() or c.stop.is_set():
                break
            if c.sidecar:
                restart = True  # until the app containers end (stop_sidecar)
            elif c.init:
                restart = rc != 0 and self.restart_policy != "Never"
            else:
                restart = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and rc != 0)
            if not restart:
                break
            if time.monotonic() - t0 > BACKOFF_RESET_AFTER:
                backoff = BACKOFF_START
            msg = f"back-off {backoff:.0f}s restarting failed container={c.name} pod={self.name}"
            with self.status.lock:
                c.last_state = c.state
                c.state = states("waiting", {"reason": "CrashLoopBackOff", "message": msg})
            self.status.publish()
            self.status.event("Warning", "BackOff", f"Back-off restarting failed container {c.name}")
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

    def stop_sidecar(self, c: ContainerRun, thread: threading.Thread) -> None:
        """End a native sidecar as kubelet does once the app containers have ended: SIGTERM, then SIGKILL
        after the pod's grace."""
        c.stop.set()
        proc = c.proc
        if proc is not None:
            _killpg(proc.pid, signal.SIGTERM)
        thread.join(self.grace)
        proc = c.proc
        if proc is not None:
            _killpg(proc.pid, signal.SIGKILL)
        thread.join()

    def signal_all(self, sig: int) -> None:
        for c in self.status.inits + self.status.apps:
            proc = c.proc
            if proc is not None:
                _killpg(proc.pid, sig)

    def _kill_container(self, c: ContainerRun, proc: subprocess.Popen[bytes], why: str) -> None:
        self.status.event("Normal", "Killing", f"Container {c.name} {why}, will be restarted")
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
            ok, msg = run_probe(probe, spec, lambda cmd, t: self._exec_probe(c, cmd, t), host=self.status.ip)
            if ok:
                ok_n[kind] += 1
                fail_n[kind] = 0
            else:
                fail_n[kind] += 1
                ok_n[kind] = 0
                label = {"startupProbe": "Startup", "readinessProbe": "Readiness", "livenessProbe": "Liveness"}[kind]
                self.status.event("Warning", "Unhealthy", f"{label} probe failed: {msg}")
            success_needed = int(probe.get("successThreshold") or 1)
            failures_allowed = int(probe.get("failureThreshold") or 3)
            changed = False
            with self.status.lock:
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
                    self.status.update_ready()
            if changed:
                self.status.publish()
            if kind in ("startupProbe", "livenessProbe") and fail_n[kind] >= failures_allowed:
                what = "failed startup probe" if kind == "startupProbe" else "failed liveness probe"
                self._kill_container(c, proc, what)
                return
