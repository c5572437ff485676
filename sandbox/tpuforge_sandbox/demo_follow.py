"""Following a running FineTuneJob (`FollowSteps`, a mixin of `DemoBase`): the live training bar, the job's
Events and `kubectl get finetunejobs` tables as it goes, the pods of each attempt and, with --preempt, the
trainer's node preempted once training is halfway (`Preemption`, in the background) and the resumed
attempt's restore quoted; at the end the attempts, or why the job failed."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from tpuforge.api import FineTuneJobSpec
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_training import TRAINER_CONTAINER
from tpuforge_sandbox.demo_base import NAMESPACE, DemoBase
from tpuforge_sandbox.demo_job import DemoError, DemoJob
from tpuforge_sandbox.demo_view import TrainingBar, duration, heading, table
from tpuforge_sandbox.sandbox import OPERATOR, Sandbox, SandboxError

JOB_TIMEOUT = 30 * 60.0
TABLE_EVERY = 30.0  # seconds between `kubectl get finetunejobs` tables while nothing changes


class FollowSteps(DemoBase):
    """The steps while the job runs, up to its end: the live view, the preemption, the attempts, a failure."""

    def follow(self, api: Any, job: DemoJob) -> dict[str, Any]:
        heading(self.console, 4, self.sections, "Training and merge, live")
        self.say(
            "(the trainer reports step, loss and tokens/s into the job's status; the operator adds phase, "
            "ETA and cost)" + ("; --preempt: the node is preempted once training is halfway" if self.preempt else "")
        )
        deadline = time.monotonic() + JOB_TIMEOUT
        seen: set[str] = set()
        phase, last_table = "", 0.0
        preemption: Preemption | None = None
        resumed_shown = False
        operator = self.sb.daemon(OPERATOR)
        with TrainingBar(self.console) as bar:
            while True:
                if operator.pid() is None:
                    raise DemoError(f"the operator has exited; last lines of {operator.log}:\n{operator.log_tail()}")
                obj = kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
                if obj is None:
                    raise DemoError(f"FineTuneJob {job.name} disappeared (deleted by someone?)")
                status = obj.get("status") or {}
                bar.update(status)
                for line in self.new_events(api, obj["metadata"]["uid"], seen):
                    bar.print(line)
                now = time.monotonic()
                if status.get("phase") != phase or now - last_table > TABLE_EVERY:
                    if status.get("phase") == "Training" and phase != "Training":
                        bar.print(
                            "  the trainer loads the model and compiles its step first: a minute or two on a "
                            "laptop's CPU (less once the XLA cache is warm), then the steps take a fraction of a second"
                        )
                    phase, last_table = status.get("phase", ""), now
                    table_text = self.kubectl_table("get", "finetunejobs")
                    if table_text:
                        bar.print(f"$ kubectl get finetunejobs\n{table_text}")
                self.remember_pods(status)
                if self.preempt and preemption is None and halfway(status, job.spec):
                    preemption = Preemption(self.sb, api, status, bar)
                    preemption.start()
                if preemption is not None and not resumed_shown:
                    resumed_shown = self.show_resume(status, bar)
                if phase in ("Succeeded", "Failed"):
                    break
                if now > deadline:
                    raise DemoError(f"FineTuneJob {job.name} did not finish within {duration(JOB_TIMEOUT)}: {status}")
                time.sleep(1.0)
        if preemption is not None:
            preemption.join()
            self.show_attempts(status)
        return status

    def new_events(self, api: Any, uid: str, seen: set[str]) -> list[str]:
        out = kube_client.request(
            api, "GET", f"/api/v1/namespaces/{NAMESPACE}/events", query={"fieldSelector": f"involvedObject.uid={uid}"}
        )
        # Timestamps have whole seconds; the resourceVersion orders events of the same second.
        events = sorted(
            out.get("items") or [],
            key=lambda e: (e.get("lastTimestamp") or "", int(e["metadata"].get("resourceVersion") or 0)),
        )
        lines = []
        for e in events:
            key = f"{e['metadata']['name']}/{e.get('count', 1)}"
            if key not in seen:
                seen.add(key)
                lines.append(f"  event {e.get('type', ''):<7} {e.get('reason', ''):<12} {e.get('message', '')}")
        return lines

    def remember_pods(self, status: Mapping[str, Any]) -> None:
        for a in status.get("attempts") or []:
            hosts = a.get("pods") or []
            if len(hosts) > 1:
                for i, pod in enumerate(hosts):
                    self.pods[f"train-{a['attempt']}-host-{i}"] = pod
            elif a.get("podName"):
                self.pods[f"train-{a['attempt']}"] = a["podName"]

    def show_resume(self, status: Mapping[str, Any], bar: TrainingBar) -> bool:
        """Once attempt 1's trainer has restored its checkpoint, quote that line of its log."""
        attempts = status.get("attempts") or []
        if len(attempts) < 2:
            return False
        for pod in attempts[1].get("pods") or [attempts[1].get("podName")]:
            log = self.sb.pod_log(NAMESPACE, pod, TRAINER_CONTAINER) if pod else None
            text = log.read_text(errors="replace") if log and log.exists() else ""
            found = re.search(r"restored step \d+.*", text)
            if found is not None:
                bar.print(f"  attempt 1 ({pod}): {found.group(0)}")
                return True
        return False

    def show_attempts(self, status: Mapping[str, Any]) -> None:
        restarts = status.get("restarts") or {}
        self.say(
            f"restarts: preemptions {restarts.get('preemptions', 0)}, failures {restarts.get('failures', 0)}; attempts:"
        )
        rows = [
            [
                str(a["attempt"]),
                a.get("podName") or "-",
                str(a.get("startStep") if a.get("startStep") is not None else "-"),
                a.get("outcome") or "-",
                a.get("message") or "",
            ]
            for a in status.get("attempts") or []
        ]
        self.console.print(table(["attempt", "pod", "start step", "outcome", "message"], rows, right=(0, 2)))

    def failed(self, status: Mapping[str, Any]) -> None:
        failed = condition(status, "Failed")
        self.say(
            f"\nthe FineTuneJob failed: {failed.get('reason', '?')}: {failed.get('message', '')}", style="bold red"
        )
        for what, pod in sorted(self.pods.items()):
            self.say(f"  {what} log: {self.tpuforge} sandbox logs {pod}")
        self.say(f"  operator log: {self.sb.daemon(OPERATOR).log}")


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})
    return found


def halfway(status: Mapping[str, Any], spec: FineTuneJobSpec) -> bool:
    """Training is past half its steps and has committed a checkpoint: time to preempt."""
    p = status.get("progress") or {}
    step, total, ckpt = p.get("step"), p.get("totalSteps"), p.get("lastCheckpointStep")
    if status.get("phase") != "Training" or step is None or not total or ckpt is None:
        return False
    return bool(step >= total / 2 and ckpt >= spec.checkpoint.every_steps)


class Preemption(threading.Thread):
    """`tpuforge sandbox preempt` on the node of the running trainer (on several hosts, the last host's), in
    the background (it returns when the node's pods are down, after the trainer has checkpointed)."""

    def __init__(self, sb: Sandbox, api: Any, status: Mapping[str, Any], bar: TrainingBar):
        super().__init__(daemon=True)
        self.sb, self.bar = sb, bar
        attempt = (status.get("attempts") or [{}])[-1]
        hosts = attempt.get("pods") or []
        pod_name = hosts[-1] if hosts else attempt.get("podName")
        pod = kube_objects.get(api, "v1", "Pod", NAMESPACE, pod_name) if pod_name else None
        self.node = (pod or {}).get("spec", {}).get("nodeName")
        p = status.get("progress") or {}
        if not self.node:
            raise DemoError(f"cannot find the node of the training pod {pod_name}")
        which = f" (host {len(hosts) - 1} of {len(hosts)})" if len(hosts) > 1 else ""
        effect = (
            "its trainer gets SIGTERM, all hosts agree on their current step, save it and exit"
            if len(hosts) > 1
            else "the trainer gets SIGTERM, saves a checkpoint at its current step and exits"
        )
        bar.print(
            f"  preempting node {self.node}{which} at step {p.get('step')} (last checkpoint: step "
            f"{p.get('lastCheckpointStep')}), as GKE reclaims a Spot VM: {effect}"
        )
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.sb.preempt(self.node)
        except (SandboxError, TimeoutError, ApiException) as e:
            self.error = e
            self.bar.print(f"  preemption failed: {e}")
