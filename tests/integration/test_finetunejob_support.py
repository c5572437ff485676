"""Shared parts of the FineTuneJob controller tests (no tests here): the operator as a real `tpuforge operator`
process, and the kubelet's part played by patching pods/status.

The training pods ask for a v6e-4 slice and the merge pods for a node pool that the sandbox has no node for,
so the node agent never runs them: each test moves them through their phases itself, which makes every
outcome (preemption, failure, success) exact and quick.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

from kubernetes import client

from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_common import merge_job_name, train_job_name
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_sandbox.operator_command import operator_argv, operator_env
from tpuforge_sandbox.procs import free_port

T = TypeVar("T")
WAIT = 30.0
# Owner-reference garbage collection of a FineTuneJob's children: kube-controller-manager's garbage collector
# watches a CRD's kind only after its discovery resync (every 30 s) has seen the CRD, so a test that runs
# just after the CRDs were installed waits up to a resync longer.
GC_WAIT = 90.0
NO_NODE_POOL = {"cloud.google.com/gke-nodepool": "no-such-pool"}


class Operator:
    """`tpuforge operator` watching one namespace, as a subprocess that a test can kill and start again."""

    def __init__(self, sandbox: Sandbox, namespace: str, log_dir: Path):
        self.sandbox, self.namespace = sandbox, namespace
        self.port = free_port()
        self.log = log_dir / f"operator-{namespace}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = operator_argv(self.sandbox.kubeconfig, self.port, [self.namespace])
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=operator_env())
        wait_for(self.metrics, WAIT, "the operator's /metrics")

    def metrics(self) -> str:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    def metric(self, metric: str, /, **labels: str) -> float | None:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.metrics().splitlines():
            series, _, value = line.rpartition(" ")
            metric_name, _, rest = series.partition("{")
            got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
            if metric_name == metric and got == want:
                return float(value)
        return None

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies under the operator's pod."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


def running_operator(sandbox: Sandbox, namespace: str, log_dir: Path) -> Iterator[Operator]:
    op = Operator(sandbox, namespace, log_dir)
    op.start()
    try:
        yield op
    finally:
        op.stop()
        assert "Traceback" not in op.log.read_text(errors="replace"), op.log_tail()


def spec(name: str, **overrides: Any) -> dict[str, Any]:
    """A valid spec whose pods no sandbox node runs (the test plays their kubelet)."""
    out: dict[str, Any] = {
        "model": {"name": "gemma4-31b", "uri": "gs://b/models/gemma4-31b"},
        "dataset": {"uri": "gs://b/data/train.jsonl"},
        "training": {"maxSeqLen": 3072, "maxSteps": 100, "warmupSteps": 10},
        "tpu": {"slice": "v6e-4"},
        "checkpoint": {"uri": f"gs://b/jobs/{name}/checkpoints"},
        "output": {"uri": f"gs://b/jobs/{name}/merged"},
        "merge": {"nodeSelector": NO_NODE_POOL},
        "preflight": {"enabled": False},  # its own test: tests/e2e/test_preflight.py
        "serviceAccountName": "default",
    }
    out.update(overrides)
    return out


class Cluster:
    """The test's view of one namespace: FineTuneJobs, their children, and the kubelet's writes."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.api, self.ns = api, namespace

    # --- FineTuneJobs ---

    def create(self, name: str | None = None, **overrides: Any) -> str:
        name = name or f"ftj-{uuid.uuid4().hex[:6]}"
        body = {
            "apiVersion": API_VERSION,
            "kind": FINETUNEJOB_KIND,
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec(name, **overrides),
        }
        kube_objects.create(self.api, body)
        return name

    def get(self, name: str) -> dict[str, Any] | None:
        return kube_objects.get(self.api, API_VERSION, FINETUNEJOB_KIND, self.ns, name)

    def status(self, name: str) -> dict[str, Any]:
        obj = self.get(name)
        assert obj is not None, f"FineTuneJob {name} is gone"
        return dict(obj.get("status") or {})

    def edit(self, name: str, spec_patch: dict[str, Any]) -> None:
        kube_objects.patch(self.api, API_VERSION, FINETUNEJOB_KIND, self.ns, name, {"spec": spec_patch})

    def delete(self, name: str) -> None:
        kube_objects.delete(self.api, API_VERSION, FINETUNEJOB_KIND, self.ns, name)

    def wait_phase(self, name: str, phase: str, timeout: float = WAIT) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            nonlocal last
            last = self.status(name)
            return last if last.get("phase") == phase else None

        try:
            return until(reached, f"{name} to reach phase {phase}", timeout)
        except TimeoutError:
            raise AssertionError(f"{name} did not reach {phase}; status: {last}") from None

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        return next(c for c in self.status(name).get("conditions", []) if c["type"] == type_)

    def events(self, name: str) -> list[tuple[str, str, str]]:
        items = kube_objects.list_objects(self.api, "v1", "Event", self.ns)
        mine = [
            e for e in items if e["involvedObject"].get("name") == name and e["involvedObject"]["kind"] == "FineTuneJob"
        ]
        mine.sort(key=lambda e: (e.get("lastTimestamp") or "", e["metadata"]["creationTimestamp"]))
        return [(e["type"], e["reason"], e["message"]) for e in mine]

    def said(self, name: str, *reasons: str) -> list[tuple[str, str, str]]:
        """The Events on `name` once every one of `reasons` is among them. The operator posts a transition's Event
        after the status write that made it, so a test that has seen the status waits for the Event."""

        def found() -> list[tuple[str, str, str]] | None:
            events = self.events(name)
            return events if set(reasons) <= {r for _, r, _ in events} else None

        return until(found, f"Events {', '.join(reasons)} on {name}")

    def wait_event(self, name: str, reason: str) -> tuple[str, str, str]:
        """The first Event on `name` with `reason`, once there is one."""
        return next(e for e in self.said(name, reason) if e[1] == reason)

    # --- children ---

    def children(self, kind: str, name: str) -> list[dict[str, Any]]:
        api_version = {
            "Job": "batch/v1",
            "Role": "rbac.authorization.k8s.io/v1",
            "RoleBinding": "rbac.authorization.k8s.io/v1",
        }.get(kind, "v1")
        return kube_objects.list_objects(self.api, api_version, kind, self.ns, f"tpuforge.dev/finetunejob={name}")

    def wait_job(self, job: str) -> dict[str, Any]:
        return until(lambda: kube_objects.get(self.api, "batch/v1", "Job", self.ns, job), f"Job {job}")

    def pod_of(self, job: str) -> dict[str, Any]:
        def one() -> dict[str, Any] | None:
            pods = kube_objects.list_objects(self.api, "v1", "Pod", self.ns, f"job-name={job}")
            return pods[0] if pods else None

        return until(one, f"a pod of Job {job}")

    # --- the kubelet's part ---

    def set_pod(self, job: str, phase: str, exit_code: int | None = None, message: str = "", **status: Any) -> str:
        """Move the pod of `job` to `phase` (with its container's exit code and termination message)."""
        pod = self.pod_of(job)
        container = pod["spec"]["containers"][0]["name"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cs: dict[str, Any] = {
            "name": container,
            "image": "x",
            "imageID": "",
            "ready": phase == "Running",
            "restartCount": 0,
        }
        if phase == "Running":
            cs["state"] = {"running": {"startedAt": now}}
        elif exit_code is not None:
            reason = "Completed" if exit_code == 0 else "Error"
            cs["state"] = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason,
                    "message": message,
                    "startedAt": now,
                    "finishedAt": now,
                }
            }
        body = {"phase": phase, "startTime": pod["status"].get("startTime") or now, "containerStatuses": [cs]}
        body.update(status)
        kube_objects.patch(
            self.api, "v1", "Pod", self.ns, pod["metadata"]["name"], {"status": body}, subresource="status"
        )
        return str(pod["metadata"]["name"])

    def train(self, name: str, attempt: int) -> str:
        return train_job_name(name, attempt)

    def merge(self, name: str) -> str:
        return merge_job_name(name)


def until(found: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
    """Poll `found` until it returns something (TimeoutError naming `what` otherwise)."""
    return cast(T, wait_for(found, timeout, what, interval=0.1))


def eventually(check: Callable[[], T], what: str, timeout: float = WAIT) -> T:
    """Retry an assertion-raising check until it passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting until {what}") from None
            time.sleep(0.1)
