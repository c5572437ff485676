"""`tpuforge demo --queue` (`make demo QUEUE=1`): two fine-tunes through one Kueue quota.

The Helm chart's Kueue objects, rendered with examples/values/kueue-demo.yaml (quota for one v5p-8 slice),
go to the sandbox, whose Kueue controller is the real one. Two FineTuneJobs (examples/finetune-queue-demo.yaml)
name the LocalQueue: Kueue admits the first's training Job and holds the second's, which shows phase Queued
with Kueue's reason (no ETA, no cost) until the first's training ends; then Kueue admits it. The live tables
are `kubectl get finetunejobs,workloads`. The demo fails (exit 1) unless both jobs succeed and the second was
held by Kueue, then admitted.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox.demo_adapters import AdaptersDemo, load_jobs
from tpuforge_sandbox.demo_base import NAMESPACE
from tpuforge_sandbox.demo_job import DemoError, DemoJob
from tpuforge_sandbox.demo_view import heading
from tpuforge_sandbox.kubeapi import Kube

JOBS_YAML = Path("examples/finetune-queue-demo.yaml")
VALUES_YAML = Path("examples/values/kueue-demo.yaml")
CHART = Path("helm/tpuforge")
SECTIONS = 5
KUEUE_PLURALS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}


def kueue_objects(root: Path, values: Path) -> list[dict[str, Any]]:
    """The chart's Kueue objects (templates/kueue.yaml) with `values`, as `helm template` renders them."""
    helm = subprocess.run(["bash", str(root / "scripts" / "get-helm.sh")], capture_output=True, text=True, check=False)
    if helm.returncode != 0:
        raise DemoError(f"the chart's Kueue objects are rendered with helm (`make helm`): {helm.stderr.strip()}")
    argv = [helm.stdout.strip(), "template", "tpuforge", str(root / CHART), "-f", str(values)]
    out = subprocess.run([*argv, "--show-only", "templates/kueue.yaml"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise DemoError(f"helm template {CHART} -f {values}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class QueueDemo(AdaptersDemo):
    jobs_yaml = JOBS_YAML
    sections = SECTIONS
    watched = "finetunejobs,workloads"

    def run(self) -> int:
        jobs = load_jobs(self.root / self.jobs_yaml, self.sb.bucket)
        self.job = jobs[0]
        kueue = kueue_objects(self.root, self.root / VALUES_YAML)
        self.start_sandbox()
        self.check_nodes(jobs[0])
        with self.api() as api:
            self.apply_kueue(api, kueue)
            self.write_inputs(jobs[0])
            self.apply_queued(api, jobs)
            statuses = self.follow_jobs(api, jobs)
            failed = [j.name for j in jobs if statuses[j.name].get("phase") != "Succeeded"]
            for name in failed:
                self.failed(statuses[name])
            held = self.show_queueing(api, jobs)
        self.problems += [f"{name} did not succeed" for name in failed]
        if not held:
            self.problems.append(f"Kueue never held {jobs[1].name}, then let it go")
        self.explore()
        return self.finish()

    def apply_kueue(self, api: Any, objs: list[dict[str, Any]]) -> None:
        heading(self.console, 2, self.sections, f"Kueue: the chart's queue objects with {VALUES_YAML}")
        self.say(
            f"$ helm template tpuforge {CHART} -f {VALUES_YAML} --show-only templates/kueue.yaml | kubectl apply -f -"
        )
        kube = Kube(api)
        for obj in objs:
            created = kube.apply_custom_object(obj, KUEUE_PLURALS[obj["kind"]])
            done = "created" if created else "configured"
            self.say(f"{obj['kind'].lower()}.kueue.x-k8s.io/{obj['metadata']['name']} {done}")
        table = self.kubectl_table("get", "clusterqueues,localqueues")
        if table:
            self.say(f"$ kubectl get clusterqueues,localqueues\n{table}")

    def apply_queued(self, api: Any, jobs: list[DemoJob]) -> None:
        heading(self.console, 4, self.sections, f"Two FineTuneJobs in one queue: {self.jobs_yaml}")
        self.remove_previous(api, jobs)
        for job in jobs:
            kube_objects.create(api, {**job.body, "metadata": {**job.body["metadata"], "namespace": NAMESPACE}})
            s = job.spec
            self.say(
                f"finetunejob.tpuforge.dev/{job.name} created: {s.training.max_steps} steps on {s.tpu.slice}, "
                f"queue {s.queue_name}"
            )
            time.sleep(2.0)  # the first is admitted first
        self.say("  the quota holds one v5p-8: Kueue admits the first, the second waits for it")

    def show_queueing(self, api: Any, jobs: list[DemoJob]) -> bool:
        """What Kueue did to each job, from the jobs' Events; True when it held the second, then admitted it."""
        heading(self.console, 5, self.sections, "What the queue did")
        said: dict[str, list[tuple[str, str]]] = {}
        for job in jobs:
            obj = kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
            uid = (obj or {}).get("metadata", {}).get("uid")
            events = kube_objects.list_objects(api, "v1", "Event", NAMESPACE)
            mine = [e for e in events if (e.get("involvedObject") or {}).get("uid") == uid]
            mine.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
            said[job.name] = [
                (e["reason"], e.get("message") or "") for e in mine if e["reason"] in ("Queued", "Admitted")
            ]
            for reason, message in said[job.name] or [("-", "admitted at once")]:
                self.say(f"  {job.name}: {reason}: {message}")
        reasons = [r for r, _ in said[jobs[1].name]]
        return "Queued" in reasons and "Admitted" in reasons
