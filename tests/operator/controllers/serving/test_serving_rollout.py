"""A model change rolling out on the sandbox, with GKE's storage semantics: the serving Deployment and its
claims as the operator builds them, on two v6e-8 nodes, whose node agent refuses to attach a ReadWriteOnce
claim to a second node (Multi-Attach). Only the containers are stand-ins: a fetch that records which model it
put on the model disk, and a server that answers /health, so that each pod starts in a second. A streamed
model (the default) has no such disk, and its rollout keeps a pod serving throughout.
"""

from __future__ import annotations

import copy
import socket
from typing import Any

import pytest
from kubernetes import client

from tpuforge import api
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.manifests import serving, serving_inputs
from tpuforge_sandbox import Sandbox, wait_for

pytestmark = pytest.mark.cluster

V1, V2 = "gs://models/merged-v1", "gs://models/merged-v2"
WAIT = 60.0
FETCH = "import os, sys; d = os.environ['MODEL_DIR']; open(d + '/served', 'w').write(sys.argv[1])"
SERVE = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
    "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def built(ns: str, uri: str, port: int, medium: str = "Disk") -> list[dict[str, Any]]:
    """The operator's claims and Deployment for a v6e-8 ServingDeployment of `uri`, with stand-in containers
    (and no owner reference: no ServingDeployment owns them here)."""
    spec = api.validate_serving(
        {
            "model": {"uri": uri, "name": "gemma4-tiny"},
            "serviceAccountName": "default",
            "vllm": {"tensorParallelSize": 1},
            "modelStorage": {"medium": medium},
        }
    )
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner(ns, "chat", "no-owner"),
        spec=spec,
        model_uri=uri,
        model=model_shape("gemma4-tiny"),
        slice=tpu_slice("v6e-8"),
    )
    claims = [c for c in (serving.model_pvc(inp), serving.xla_cache_pvc(inp)) if c is not None]
    objs = [*claims, serving.deployment(inp)]
    for obj in objs:
        obj["metadata"].pop("ownerReferences", None)
    pod = objs[-1]["spec"]["template"]["spec"]
    fetch, vllm = pod["initContainers"][0], pod["containers"][0]
    if medium == "Stream":
        fetch.update(command=["python", "-c", "pass"], args=[])  # the check of a model vLLM streams
    else:
        fetch.update(command=["python", "-c", FETCH, uri], args=[])
        fetch["env"] = [*fetch.get("env", []), {"name": "MODEL_DIR", "value": spec.vllm.model_path}]
    vllm.update(command=["python", "-c", SERVE], args=[], image="tpuforge/stand-in")
    vllm["env"] = [*vllm["env"], {"name": "PORT", "value": str(port)}]
    for probe in ("startupProbe", "livenessProbe"):
        del vllm[probe]
    vllm["readinessProbe"] = {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 1}
    pod["terminationGracePeriodSeconds"] = 5
    return objs


def pods(core: client.CoreV1Api, ns: str) -> list[client.V1Pod]:
    selector = ",".join(f"{k}={v}" for k, v in serving_inputs.selector_labels("chat").items())
    return [p for p in core.list_namespaced_pod(ns, label_selector=selector).items if not p.metadata.deletion_timestamp]


def serving_only(core: client.CoreV1Api, ns: str, uri: str) -> client.V1Pod | None:
    """The one pod left, once it serves `uri` and is ready."""
    live = pods(core, ns)
    if len(live) != 1 or live[0].metadata.annotations.get(serving.ANNOTATION_MODEL_URI) != uri:
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in live[0].status.conditions or [])
    return live[0] if ready else None


def start(
    api_client: client.ApiClient, ns: str, strategy: dict[str, Any] | None, medium: str = "Disk"
) -> tuple[list[dict[str, Any]], int]:
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    port = free_port()
    objs = built(ns, V1, port, medium)
    if strategy is not None:
        objs[-1]["spec"]["strategy"] = strategy
    for claim in objs[:-1]:
        core.create_namespaced_persistent_volume_claim(ns, claim)
    apps.create_namespaced_deployment(ns, objs[-1])
    wait_for(lambda: serving_only(core, ns, V1), WAIT, "the first model's pod to be ready")
    return objs, port


def roll_to_v2(api_client: client.ApiClient, ns: str, port: int, strategy: dict[str, Any] | None) -> None:
    new = copy.deepcopy(built(ns, V2, port)[-1])
    if strategy is not None:
        new["spec"]["strategy"] = strategy
    client.AppsV1Api(api_client).replace_namespaced_deployment(new["metadata"]["name"], ns, new)


def test_a_new_model_rolls_out_when_the_pod_is_recreated_on_its_disks(
    api_client: client.ApiClient, sandbox: Sandbox, namespace: str
) -> None:
    core, ns = client.CoreV1Api(api_client), namespace
    objs, port = start(api_client, ns, None)
    assert objs[-1]["spec"]["strategy"] == {"type": "Recreate"}
    roll_to_v2(api_client, ns, port, None)
    pod = wait_for(lambda: serving_only(core, ns, V2), WAIT, "the new model's pod to be ready")
    dep = client.AppsV1Api(api_client).read_namespaced_deployment(objs[-1]["metadata"]["name"], ns)
    wait_for(lambda: dep.status.updated_replicas == 1, WAIT, "the rollout to finish")
    # The same model disk moved to the new pod, which wrote the new model on it.
    claim = objs[0]["metadata"]["name"]
    assert (sandbox.dir / "claims" / ns / claim / "served").read_text() == V2
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod.metadata.name}").items
    assert not any(e.reason == "FailedAttachVolume" for e in events)


def test_a_surge_rollout_on_read_write_once_disks_stalls_as_on_gke(
    api_client: client.ApiClient, namespace: str
) -> None:
    """The design this replaces: maxSurge 1 starts the new pod on the other v6e-8 node (the old one holds all
    8 chips of its own), where the disks are still attached to the old pod's node."""
    core, ns = client.CoreV1Api(api_client), namespace
    surge = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    _, port = start(api_client, ns, surge)
    old = pods(core, ns)[0]
    roll_to_v2(api_client, ns, port, surge)

    def refused() -> str | None:
        for p in pods(core, ns):
            if p.metadata.name == old.metadata.name:
                continue
            items = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={p.metadata.name}").items
            found = next((e.message for e in items if e.reason == "FailedAttachVolume"), None)
            if found:
                assert p.spec.node_name != old.spec.node_name
                return found
        return None

    assert f"Volume is already used by pod(s) {old.metadata.name}" in wait_for(refused, WAIT, "Multi-Attach")
    assert [p.metadata.name for p in pods(core, ns) if p.status.phase == "Running"] == [old.metadata.name]


def test_a_streamed_model_rolls_out_on_another_node_while_the_old_pod_serves(
    api_client: client.ApiClient, namespace: str
) -> None:
    """modelStorage.medium Stream: no claim at all, so the surge pod starts on the other v6e-8 node at once,
    and the old pod goes only once the new one is ready: at every moment one pod is ready."""
    core, apps, ns = client.CoreV1Api(api_client), client.AppsV1Api(api_client), namespace
    objs, _ = start(api_client, ns, None, medium="Stream")
    assert len(objs) == 1  # the Deployment only: no model claim, and the XLA cache is the node's
    assert objs[0]["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    old = pods(core, ns)[0]
    # The stand-in servers share this machine's loopback: the new one listens on a port of its own.
    new = built(ns, V2, free_port(), medium="Stream")[-1]
    apps.replace_namespaced_deployment(new["metadata"]["name"], ns, new)
    seen_ready: list[int] = []

    def rolled() -> client.V1Pod | None:
        live = pods(core, ns)
        seen_ready.append(
            sum(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) for p in live)
        )
        return serving_only(core, ns, V2)

    pod = wait_for(rolled, WAIT, "the new model's pod to be ready", interval=0.2)
    assert pod.spec.node_name != old.spec.node_name  # started beside the old one, on the other TPU VM
    assert min(seen_ready) >= 1, seen_ready  # the endpoint had a ready pod throughout
    assert core.list_namespaced_persistent_volume_claim(ns).items == []
