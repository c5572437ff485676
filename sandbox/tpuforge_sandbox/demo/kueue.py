"""The steps of `tpuforge demo --queue` (`make demo QUEUE=1`), functions of the session: two fine-tunes
through one Kueue quota.

The Helm chart's Kueue objects, rendered with examples/values/kueue-demo.yaml (quota for one v5p-8 slice), go
to the sandbox, whose Kueue controller is the real one. Two FineTuneJobs (examples/finetune-queue-demo.yaml)
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
from tpuforge_sandbox.demo.job import DemoError
from tpuforge_sandbox.demo.session import NAMESPACE, DemoSession
from tpuforge_sandbox.demo.setup import namespaced, remove_previous
from tpuforge_sandbox.kubeapi import Kube

VALUES_YAML = Path("examples/values/kueue-demo.yaml")
CHART = Path("helm/tpuforge")
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


def read_kueue(s: DemoSession) -> None:
    """The chart's Kueue objects, rendered before anything starts."""
    s.kueue = kueue_objects(s.root, s.root / VALUES_YAML)


def apply_kueue(s: DemoSession) -> None:
    s.say(f"$ helm template tpuforge {CHART} -f {VALUES_YAML} --show-only templates/kueue.yaml | kubectl apply -f -")
    kube = Kube(s.api)
    for obj in s.kueue:
        created = kube.apply_custom_object(obj, KUEUE_PLURALS[obj["kind"]])
        done = "created" if created else "configured"
        s.say(f"{obj['kind'].lower()}.kueue.x-k8s.io/{obj['metadata']['name']} {done}")
    table = s.kubectl_table("get", "clusterqueues,localqueues")
    if table:
        s.say(f"$ kubectl get clusterqueues,localqueues\n{table}")


def apply_queued(s: DemoSession) -> None:
    remove_previous(s, s.jobs)
    for job in s.jobs:
        kube_objects.create(s.api, namespaced(job.body))
        spec = job.spec
        s.say(
            f"finetunejob.tpuforge.dev/{job.name} created: {spec.training.max_steps} steps on {spec.tpu.slice}, "
            f"queue {spec.queue_name}"
        )
        time.sleep(2.0)  # the first is admitted first
    s.say("  the quota holds one v5p-8: Kueue admits the first, the second waits for it")


def show_queueing(s: DemoSession) -> None:
    """What Kueue did to each job, from the jobs' Events; a problem unless it held the second, then admitted it."""
    said: dict[str, list[tuple[str, str]]] = {}
    for job in s.jobs:
        obj = kube_objects.get(s.api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
        uid = (obj or {}).get("metadata", {}).get("uid")
        events = kube_objects.list_objects(s.api, "v1", "Event", NAMESPACE)
        mine = [e for e in events if (e.get("involvedObject") or {}).get("uid") == uid]
        mine.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        said[job.name] = [(e["reason"], e.get("message") or "") for e in mine if e["reason"] in ("Queued", "Admitted")]
        for reason, message in said[job.name] or [("-", "admitted at once")]:
            s.say(f"  {job.name}: {reason}: {message}")
    second = s.jobs[1].name
    reasons = [r for r, _ in said[second]]
    if not ("Queued" in reasons and "Admitted" in reasons):
        s.problems.append(f"Kueue never held {second}, then let it go")
