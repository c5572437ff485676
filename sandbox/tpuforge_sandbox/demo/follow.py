"""Following the running FineTuneJobs, steps of the session: for one job the live training bar, its Events and
`kubectl get finetunejobs` tables as it goes, the pods of each attempt and, with --preempt, the trainer's node
preempted once training is halfway (`Preemption`, in the background) and the resumed attempt's restore quoted;
for several jobs their Events and tables until all have ended. At the end the attempts, or why a job failed."""

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
from tpuforge_sandbox.demo import setup
from tpuforge_sandbox.demo.job import DemoError
from tpuforge_sandbox.demo.session import NAMESPACE, DemoSession
from tpuforge_sandbox.demo.view import TrainingBar, duration, table
from tpuforge_sandbox.sandbox import OPERATOR, Sandbox, SandboxError

JOB_TIMEOUT = 30 * 60.0
TABLE_EVERY = 30.0  # seconds between `kubectl get finetunejobs` tables while nothing changes


def follow(s: DemoSession) -> None:
    """The one job, live, until it has ended; its last status in `s.statuses`."""
    job = s.job
    assert job is not None
    api = s.api
    s.say(
        "(the trainer reports step, loss and tokens/s into the job's status; the operator adds phase, "
        "ETA and cost)" + ("; --preempt: the node is preempted once training is halfway" if s.preempt else "")
    )
    deadline = time.monotonic() + JOB_TIMEOUT
    seen: set[str] = set()
    phase, last_table = "", 0.0
    preemption: Preemption | None = None
    resumed_shown = False
    operator = s.sb.daemon(OPERATOR)
    with TrainingBar(s.console) as bar:
        while True:
            if operator.pid() is None:
                raise DemoError(f"the operator has exited; last lines of {operator.log}:\n{operator.log_tail()}")
            obj = kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
            if obj is None:
                raise DemoError(f"FineTuneJob {job.name} disappeared (deleted by someone?)")
            status = obj.get("status") or {}
            bar.update(status)
            for line in new_events(api, obj["metadata"]["uid"], seen):
                bar.print(line)
            now = time.monotonic()
            if status.get("phase") != phase or now - last_table > TABLE_EVERY:
                if status.get("phase") == "Training" and phase != "Training":
                    bar.print(
                        "  the trainer loads the model and compiles its step first: a minute or two on a "
                        "laptop's CPU (less once the XLA cache is warm), then the steps take a fraction of a second"
                    )
                phase, last_table = status.get("phase", ""), now
                table_text = s.kubectl_table("get", "finetunejobs")
                if table_text:
                    bar.print(f"$ kubectl get finetunejobs\n{table_text}")
            remember_pods(s, status)
            if s.preempt and preemption is None and halfway(status, job.spec):
                preemption = Preemption(s.sb, api, status, bar)
                preemption.start()
            if preemption is not None and not resumed_shown:
                resumed_shown = show_resume(s, status, bar)
            if phase in ("Succeeded", "Failed"):
                break
            if now > deadline:
                raise DemoError(f"FineTuneJob {job.name} did not finish within {duration(JOB_TIMEOUT)}: {status}")
            time.sleep(1.0)
    if preemption is not None:
        preemption.join()
        show_attempts(s, status)
    s.statuses[job.name] = status


def follow_jobs(s: DemoSession) -> None:
    """Several jobs, their Events and `kubectl get` tables, until every one has ended; their last statuses in
    `s.statuses`."""
    api, jobs, watched = s.api, s.jobs, s.scenario.watched
    deadline = time.monotonic() + JOB_TIMEOUT * len(jobs)
    seen: set[str] = set()
    phases: dict[str, str] = {}
    last_table = 0.0
    operator = s.sb.daemon(OPERATOR)
    while True:
        if operator.pid() is None:
            raise DemoError(f"the operator has exited; last lines of {operator.log}:\n{operator.log_tail()}")
        statuses = {}
        for job in jobs:
            obj = kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
            if obj is None:
                raise DemoError(f"FineTuneJob {job.name} disappeared (deleted by someone?)")
            statuses[job.name] = obj.get("status") or {}
            for line in new_events(api, obj["metadata"]["uid"], seen):
                s.say(f"  {job.name}: {line.strip()}")
            remember_pods(s, statuses[job.name])
        now = time.monotonic()
        current = {name: st.get("phase", "") for name, st in statuses.items()}
        if current != phases or now - last_table > TABLE_EVERY:
            phases, last_table = current, now
            text = s.kubectl_table("get", watched)
            if text:
                s.say(f"$ kubectl get {watched}\n{text}")
        if all(p in ("Succeeded", "Failed") for p in phases.values()):
            s.statuses.update(statuses)
            return
        if now > deadline:
            raise DemoError(f"the jobs did not finish within {duration(deadline - s.started)}: {phases}")
        time.sleep(2.0)


def run_start(s: DemoSession, purpose: str) -> None:
    """The first of the scenario's jobs, the start the next one trains from (its spec.model.fineTuneJobRef):
    every job of an earlier run removed, then this one applied alone and followed to its end (training and
    merge); the demo halts unless it succeeded. `purpose`: a line on what it is for."""
    jobs = list(s.jobs)
    setup.remove_previous(s, jobs)
    s.jobs = [jobs[0]]
    s.say(purpose)
    setup.apply_job(s)
    follow(s)
    halt_unless_succeeded(s)
    s.jobs = jobs


def halt_unless_succeeded(s: DemoSession) -> None:
    """A job that did not succeed ends the demo: why, and where to look."""
    for job in s.jobs:
        status = s.statuses[job.name]
        if status.get("phase") != "Succeeded":
            failed(s, status)
            s.halted = True


def note_failures(s: DemoSession) -> None:
    """A job that did not succeed is a problem the demo reports at its end; it goes on to show the rest."""
    for job in s.jobs:
        status = s.statuses[job.name]
        if status.get("phase") != "Succeeded":
            failed(s, status)
            s.problems.append(f"{job.name} did not succeed")


def new_events(api: Any, uid: str, seen: set[str]) -> list[str]:
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


def remember_pods(s: DemoSession, status: Mapping[str, Any]) -> None:
    for a in status.get("attempts") or []:
        hosts = a.get("pods") or []
        if len(hosts) > 1:
            for i, pod in enumerate(hosts):
                s.pods[f"train-{a['attempt']}-host-{i}"] = pod
        elif a.get("podName"):
            s.pods[f"train-{a['attempt']}"] = a["podName"]


def show_resume(s: DemoSession, status: Mapping[str, Any], bar: TrainingBar) -> bool:
    """Once attempt 1's trainer has restored its checkpoint, quote that line of its log."""
    attempts = status.get("attempts") or []
    if len(attempts) < 2:
        return False
    for pod in attempts[1].get("pods") or [attempts[1].get("podName")]:
        log = s.sb.pod_log(NAMESPACE, pod, TRAINER_CONTAINER) if pod else None
        text = log.read_text(errors="replace") if log and log.exists() else ""
        found = re.search(r"restored step \d+.*", text)
        if found is not None:
            bar.print(f"  attempt 1 ({pod}): {found.group(0)}")
            return True
    return False


def show_attempts(s: DemoSession, status: Mapping[str, Any]) -> None:
    restarts = status.get("restarts") or {}
    s.say(f"restarts: preemptions {restarts.get('preemptions', 0)}, failures {restarts.get('failures', 0)}; attempts:")
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
    s.console.print(table(["attempt", "pod", "start step", "outcome", "message"], rows, right=(0, 2)))


def failed(s: DemoSession, status: Mapping[str, Any]) -> None:
    why = condition(status, "Failed")
    s.say(f"\nthe FineTuneJob failed: {why.get('reason', '?')}: {why.get('message', '')}", style="bold red")
    for what, pod in sorted(s.pods.items()):
        s.say(f"  {what} log: {s.tpuforge} sandbox logs {pod}")
    s.say(f"  operator log: {s.sb.daemon(OPERATOR).log}")


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
