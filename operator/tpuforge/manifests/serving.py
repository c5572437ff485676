"""ServingDeployment -> the Kubernetes objects that serve it: a vLLM-TPU Deployment (with a model-fetch init
container, which only checks the model when vLLM streams it from GCS, and, when it serves LoRA adapters, an
adapter-fetch sidecar), a Service, the XLA compilation cache PVC and the model's PVC where the spec keeps them,
and PodMonitoring / ServiceMonitor objects. The vLLM process itself (arguments,
environment, probes) is vllm_server's; the inputs, names and labels are serving_inputs'.

Pure: the same inputs give the same objects. The caller resolves what needs the API (the model URI, the
owner's uid) and passes it in `ServingInputs`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tpuforge.api import resources
from tpuforge.api.constants import LABEL_COMPONENT, TERMINATION_LOG
from tpuforge.api.images import PUBLIC_IMAGES
from tpuforge.api.serving import ServingDeploymentSpec

# ADAPTERS_DIR lives with validation, which keeps spec.vllm.modelPath out of it.
from tpuforge.api.serving_validation import ADAPTERS_DIR
from tpuforge.manifests.common import (
    LABEL_OWNER_UID,
    Obj,
    image_pull_secrets,
    locked_down,
    pod_annotations,
    tpu_resources,
    tpu_scheduling,
    with_scheduling,
)
from tpuforge.manifests.serving_inputs import (
    COMPONENT,
    ServingInputs,
    labels,
    names,
    object_metadata,
    selector_labels,
)
from tpuforge.manifests.vllm_server import (
    HEALTH_PATH,
    METRICS_PATH,
    STARTUP_BUDGET_SECONDS,
    VLLM_PORT,
    XLA_CACHE_MOUNT,
    lora_enabled,
    max_lora_rank,
    probes,
    vllm_args,
    vllm_env,
)

# Pod template annotations naming the model: a new merged model changes the template, which rolls the pods,
# and each pod says which model it serves.
ANNOTATION_MODEL_URI = "tpuforge.dev/model-uri"
ANNOTATION_MODEL_REVISION = "tpuforge.dev/model-revision"
MONITOR_INTERVAL = "30s"
# The adapters sidecar: fetches LoRA adapters on the operator's request into a volume vLLM reads them from.
ADAPTERS_PORT = 8001
ADAPTERS_CONTAINER = "adapters"
VLLM_CONTAINER = "vllm"
FETCH_CONTAINER = "fetch-model"


def endpoint(name: str, namespace: str) -> str:
    """The OpenAI-compatible base URL inside the cluster."""
    return f"http://{names(name).service}.{namespace}.svc:{VLLM_PORT}/v1"


def pods_selector(owner_uid: str) -> str:
    """The label selector of the serving pods of one ServingDeployment object (by uid: not a same-named
    predecessor's pods, which may still be going away)."""
    return f"{LABEL_OWNER_UID}={owner_uid},{LABEL_COMPONENT}={COMPONENT}"


def streams(spec: ServingDeploymentSpec) -> bool:
    """vLLM reads the weights from the model's gs:// directory itself (the Run:ai model streamer): no model
    volume, no copy."""
    return spec.model_storage.medium == "Stream"


def node_local_xla_cache(spec: ServingDeploymentSpec) -> bool:
    """With a streamed model, a ReadWriteOnce cache would be the pods' only disk, and pin them to its node (and
    zone) as the model disk does: it is an emptyDir on the node instead. A shared (ReadWriteMany) cache stays."""
    return streams(spec) and spec.xla_cache.access_mode == "ReadWriteOnce"


def uncommitted_base(spec: ServingDeploymentSpec) -> bool:
    """A base for adapters named by URI is usually a checkpoint uploaded as it is, without `_COMPLETE`; a merged
    model (a FineTuneJob's output, or a URI served without adapters) must be committed. A base that has the
    marker is checked against its manifest either way."""
    return spec.model.uri is not None and lora_enabled(spec)


def fetch_args(inp: ServingInputs) -> list[str]:
    # The termination log is passed, not defaulted, so that every path the container writes is in its args.
    # A streamed model is only checked (committed, files as listed, safetensors weights): vLLM reads it.
    where = ["--check-only"] if streams(inp.spec) else ["--target-dir", inp.spec.vllm.model_path]
    args = ["--model-uri", inp.model_uri, *where, "--termination-log", TERMINATION_LOG]
    if uncommitted_base(inp.spec):
        args.append("--uncommitted-base")
    return args


def adapters_sidecar(inp: ServingInputs, model_id: str) -> Obj:
    """Fetches adapters into the shared volume when the operator asks (port 8001), checking each against the
    base in the model volume (or, for a streamed model, in GCS). It takes no per-adapter arguments, so adapters
    change without a new template."""
    model_dir = inp.model_uri if streams(inp.spec) else inp.spec.vllm.model_path
    mounts: list[Obj] = [] if streams(inp.spec) else [model_mount(inp)]
    return {
        "name": ADAPTERS_CONTAINER,
        "image": inp.spec.images.adapters or PUBLIC_IMAGES.adapters,
        "command": ["python", "-m", "tpuforge_workloads.serve.adapters"],
        "args": [
            "--model-dir",
            model_dir,
            "--model-name",
            model_id,
            "--adapters-dir",
            ADAPTERS_DIR,
            "--max-lora-rank",
            str(max_lora_rank(inp)),
            "--host",
            "$(POD_IP)",
            "--port",
            str(ADAPTERS_PORT),
        ],
        # The operator reaches it at the pod's IP; nothing else needs it.
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "adapters", "containerPort": ADAPTERS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
        "readinessProbe": {
            "httpGet": {"path": HEALTH_PATH, "port": ADAPTERS_PORT},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
        },
        "volumeMounts": [*mounts, {"name": "adapters", "mountPath": ADAPTERS_DIR}],
    }


def model_mount(inp: ServingInputs) -> Obj:
    return {"name": "model", "mountPath": inp.spec.vllm.model_path, "readOnly": True}


def scrape_annotations() -> dict[str, str]:
    """For Prometheus setups that discover targets by annotation."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(VLLM_PORT),
        "prometheus.io/path": METRICS_PATH,
    }


def pod_template(inp: ServingInputs) -> Obj:
    spec = inp.spec
    model_dir = spec.vllm.model_path
    lora = lora_enabled(spec)
    stream = streams(spec)
    vllm: Obj = {
        "name": VLLM_CONTAINER,
        "image": spec.vllm.image or PUBLIC_IMAGES.serving,
        "command": ["vllm", "serve"],
        "args": vllm_args(inp),
        "env": vllm_env(lora),
        # vLLM writes no termination message: the tail of its log says why it stopped.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        "resources": tpu_resources(inp.slice, resources.tpu_server_requests(spec.tpu.resources, inp.model)),
        "volumeMounts": [
            *([] if stream else [model_mount(inp)]),
            {"name": "xla-cache", "mountPath": XLA_CACHE_MOUNT},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        **probes(),
    }
    # The model-fetch init container and the adapters sidecar default to the merger image: it holds
    # tpuforge_workloads and the GCS client.
    fetch: Obj = {
        "name": FETCH_CONTAINER,
        "image": spec.images.model_fetch or PUBLIC_IMAGES.model_fetch,
        "command": ["python", "-m", "tpuforge_workloads.serve.fetch"],
        "args": fetch_args(inp),
        "resources": resources.FETCH_RESOURCES,
        "volumeMounts": [] if stream else [{"name": "model", "mountPath": model_dir}],
        "terminationMessagePath": TERMINATION_LOG,
    }
    volumes: list[Obj] = [
        *([] if stream else [model_volume(inp)]),
        xla_cache_volume(inp),
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    # What lives on the node's disk (a NodeLocal model copy, a node-local XLA cache) is requested, so that the
    # scheduler and the kubelet's eviction count it.
    local = {**(local_model_request(inp) if spec.model_storage.medium == "NodeLocal" else {})}
    if node_local_xla_cache(spec):
        local["ephemeral-storage"] = spec.xla_cache.size
    if local:
        vllm["resources"] = {**vllm["resources"], "requests": {**vllm["resources"]["requests"], **local}}
    containers = [vllm]
    if lora:
        # Same path in both containers: the path the sidecar reports is the lora_path vLLM loads.
        vllm["volumeMounts"].append({"name": "adapters", "mountPath": ADAPTERS_DIR, "readOnly": True})
        containers.append(adapters_sidecar(inp, inp.model.id))
        volumes.append({"name": "adapters", "emptyDir": {}})
    pod: Obj = {
        **tpu_scheduling(inp.slice, spec.tpu.spot, spec.tpu.spot_grace_seconds),
        # A Hyperdisk ML volume arrives filled (GKE's Volume Populator) and read-only: nothing to fetch.
        **({} if spec.model_storage.medium == "HyperdiskML" else {"initContainers": [fetch]}),
        "containers": containers,
        "volumes": volumes,
        **image_pull_secrets(spec.images.pull_secrets),
    }
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    pod = with_scheduling(pod, spec.tpu.scheduling)
    # Neither vLLM nor the model fetch talks to the Kubernetes API (GCS access is Workload Identity's).
    root = frozenset({VLLM_CONTAINER}) if spec.tpu.run_as_root else frozenset()
    pod = locked_down(pod, api_access=False, root_containers=root)
    own = {ANNOTATION_MODEL_URI: inp.model_uri, **scrape_annotations()}
    if inp.model_revision:
        own[ANNOTATION_MODEL_REVISION] = inp.model_revision
    annotations = pod_annotations(own, spec.tpu.scheduling)
    return {"metadata": {"labels": labels(inp.owner), "annotations": annotations}, "spec": pod}


def surges(spec: ServingDeploymentSpec) -> bool:
    """Whether a new pod may start beside the old ones. It lands on another TPU VM (the old pod holds every chip
    of its own), so every volume it shares with them must attach to many nodes; a ReadWriteOnce disk cannot
    (GKE: Multi-Attach error), and a surge pod would wait for it for ever while the old pod is never removed.
    A streamed model shares no ReadWriteOnce disk (its cache is the node's, or a ReadWriteMany claim)."""
    if streams(spec):
        return True
    return spec.xla_cache.access_mode == "ReadWriteMany" and spec.model_storage.medium in ("NodeLocal", "HyperdiskML")


def strategy(spec: ServingDeploymentSpec) -> Obj:
    if surges(spec):
        # Keep the old server answering while the new one loads and compiles (it needs a free slice).
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # The old pod goes first and frees its disks; the new one attaches them, wherever it is scheduled.
    return {"type": "Recreate"}


def deployment(inp: ServingInputs) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_metadata(inp, names(inp.name).deployment),
        "spec": {
            "replicas": inp.spec.replicas,
            "selector": {"matchLabels": selector_labels(inp.name)},
            "strategy": strategy(inp.spec),
            # A rollout that has not become ready within the compile budget is reported as stalled.
            "progressDeadlineSeconds": STARTUP_BUDGET_SECONDS + 600,
            "template": pod_template(inp),
        },
    }


def disruption_budget(inp: ServingInputs) -> Obj:
    """The vLLM pods' PodDisruptionBudget: at most one down at a time by default, spec.disruption.minAvailable
    where set. A pod not ready yet (compiling, or failing) may always be evicted: it serves nothing."""
    chosen = inp.spec.disruption.min_available
    budget: Obj = {"minAvailable": chosen} if chosen is not None else {"maxUnavailable": 1}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_metadata(inp, names(inp.name).deployment),
        "spec": {
            **budget,
            "selector": {"matchLabels": selector_labels(inp.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def selector(name: str) -> str:
    """The vLLM pods' label selector as a string (status.selector, which an HPA reads through the scale
    subresource)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def service(inp: ServingInputs) -> Obj:
    meta = object_metadata(inp, names(inp.name).service)
    meta["annotations"] = scrape_annotations()
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(inp.name),
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def xla_cache_owned(spec: ServingDeploymentSpec) -> bool:
    """Owned (so garbage-collected with the ServingDeployment) unless the spec asks to keep it."""
    return not spec.xla_cache.retain_on_delete


def _claim(inp: ServingInputs, name: str, size: str, mode: str, storage_class: str | None, owned: bool) -> Obj:
    spec: Obj = {"accessModes": [mode], "resources": {"requests": {"storage": size}}}
    if storage_class or inp.storage_class:
        spec["storageClassName"] = storage_class or inp.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_metadata(inp, name, owned=owned),
        "spec": spec,
    }


def xla_cache_volume(inp: ServingInputs) -> Obj:
    if node_local_xla_cache(inp.spec):
        return {"name": "xla-cache", "emptyDir": {"sizeLimit": inp.spec.xla_cache.size}}
    return {"name": "xla-cache", "persistentVolumeClaim": {"claimName": names(inp.name).xla_cache}}


def xla_cache_pvc(inp: ServingInputs) -> Obj | None:
    """The cache's claim, or None where the cache is the node's (a streamed model, ReadWriteOnce)."""
    if node_local_xla_cache(inp.spec):
        return None
    cache = inp.spec.xla_cache
    return _claim(
        inp,
        names(inp.name).xla_cache,
        cache.size,
        cache.access_mode,
        cache.storage_class_name,
        xla_cache_owned(inp.spec),
    )


# Room beside the model for the shards a new model's fetch writes before it replaces the old ones.
MODEL_HEADROOM = 1.25
GIB = 1 << 30


def model_size(inp: ServingInputs) -> str:
    """spec.modelStorage.size, else the checkpoint's bytes (ModelShape.weight_bytes) plus headroom, in whole GiB."""
    given = inp.spec.model_storage.size
    return given or f"{max(1, math.ceil(inp.model.weight_bytes * MODEL_HEADROOM / GIB))}Gi"


def model_volume(inp: ServingInputs) -> Obj:
    if inp.spec.model_storage.medium == "NodeLocal":
        return {"name": "model", "emptyDir": {"sizeLimit": model_size(inp)}}
    claim: Obj = {"claimName": names(inp.name).model}
    if inp.spec.model_storage.medium == "HyperdiskML":
        claim["readOnly"] = True  # a Hyperdisk ML disk attaches to many nodes read-only only
    return {"name": "model", "persistentVolumeClaim": claim}


def local_model_request(inp: ServingInputs) -> dict[str, str]:
    return {"ephemeral-storage": model_size(inp)}


# GKE's Volume Populator fills a claim whose dataSourceRef names one of these from Cloud Storage.
GCP_DATA_SOURCE = {"apiGroup": "datalayer.gke.io", "kind": "GCPDataSource"}


def model_pvc(inp: ServingInputs) -> Obj | None:
    """None for a streamed model (medium Stream). The model's disk (medium Disk): the fetched copy survives pod
    restarts, so a restarted or rescheduled pod skips the download; collected with the ServingDeployment. With
    HyperdiskML, a read-only-many Hyperdisk ML claim that the Volume Populator fills from the spec's
    GCPDataSource, attached to every replica's node."""
    storage = inp.spec.model_storage
    if storage.medium == "HyperdiskML":
        claim = _claim(inp, names(inp.name).model, model_size(inp), "ReadOnlyMany", storage.storage_class_name, True)
        claim["spec"]["dataSourceRef"] = {**GCP_DATA_SOURCE, "name": storage.data_source}
        return claim
    if storage.medium != "Disk":
        return None
    return _claim(inp, names(inp.name).model, model_size(inp), "ReadWriteOnce", storage.storage_class_name, True)


def _monitor_endpoint() -> Obj:
    return {"port": "http", "path": METRICS_PATH, "interval": MONITOR_INTERVAL}


def pod_monitoring(inp: ServingInputs) -> Obj:
    """GKE Managed Service for Prometheus."""
    return {
        "apiVersion": "monitoring.googleapis.com/v1",
        "kind": "PodMonitoring",
        "metadata": object_metadata(inp, names(inp.name).monitor),
        "spec": {"selector": {"matchLabels": selector_labels(inp.name)}, "endpoints": [_monitor_endpoint()]},
    }


def service_monitor(inp: ServingInputs) -> Obj:
    """Prometheus Operator."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": object_metadata(inp, names(inp.name).monitor),
        "spec": {
            "selector": {"matchLabels": selector_labels(inp.name)},
            "namespaceSelector": {"matchNames": [inp.namespace]},
            "endpoints": [_monitor_endpoint()],
        },
    }


@dataclass(frozen=True)
class MonitorKind:
    """A scrape-configuration kind (a CRD) the operator fills in when the cluster serves it."""

    kind: str
    group: str
    version: str
    plural: str
    build: Callable[[ServingInputs], Obj]


MONITOR_KINDS = (
    MonitorKind(
        kind="PodMonitoring",
        group="monitoring.googleapis.com",
        version="v1",
        plural="podmonitorings",
        build=pod_monitoring,
    ),
    MonitorKind(
        kind="ServiceMonitor",
        group="monitoring.coreos.com",
        version="v1",
        plural="servicemonitors",
        build=service_monitor,
    ),
)
