"""ServingDeployment -> the Kubernetes objects that serve it: a vLLM-TPU Deployment (with a model-fetch init
container and, when it serves LoRA adapters, an adapter-fetch sidecar), a Service, the XLA compilation cache
PVC and the model's PVC, and PodMonitoring / ServiceMonitor objects.

Pure: the same inputs give the same objects. The caller resolves what needs the API (the model URI, the
owner's uid) and passes it in `ServingInputs`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from tpuforge.api import resources
from tpuforge.api.catalog import ModelShape, TpuSlice
from tpuforge.api.constants import (
    API_VERSION,
    DEFAULT_MERGER_IMAGE,
    LABEL_COMPONENT,
    LABEL_SERVING,
    MULTIMODAL_MAX_NUM_BATCHED_TOKENS,
    SERVING_KIND,
    TERMINATION_LOG,
)
from tpuforge.api.serving import ServingDeploymentSpec

# ADAPTERS_DIR lives with validation, which keeps spec.vllm.modelPath out of it.
from tpuforge.api.serving_validation import ADAPTERS_DIR
from tpuforge.api.validation import FieldError
from tpuforge.manifests.common import (
    MAX_NAME,
    Obj,
    Owner,
    child_name,
    label_value,
    locked_down,
    metadata,
    standard_labels,
    tpu_resources,
    tpu_scheduling,
)

VLLM_PORT = 8000
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
XLA_CACHE_MOUNT = "/xla-cache"
# vLLM-TPU compiles for 8-10 minutes on a cold cache; its own v6e-8 benchmark allows an hour. The engine
# timeout and the startup probe share this budget so that neither gives up before the other.
STARTUP_BUDGET_SECONDS = 3600
STARTUP_PROBE_PERIOD_SECONDS = 10
# The init container reuses the merger image: it holds tpuforge_workloads and the GCS client.
FETCH_IMAGE = DEFAULT_MERGER_IMAGE
# Pod template annotations naming the model: a new merged model changes the template, which rolls the pods,
# and each pod says which model it serves.
ANNOTATION_MODEL_URI = "tpuforge.dev/model-uri"
ANNOTATION_MODEL_REVISION = "tpuforge.dev/model-revision"
APP = "vllm"
COMPONENT = "serving"
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
MONITOR_INTERVAL = "30s"
# The adapters sidecar: fetches LoRA adapters on the operator's request into a volume vLLM reads them from.
ADAPTERS_PORT = 8001
ADAPTERS_CONTAINER = "adapters"
# The ranks vLLM's --max-lora-rank accepts (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# --max-lora-rank when an adapter's rank is not known ahead (a URI adapter): covers the usual LoRA ranks.
DEFAULT_URI_LORA_RANK = 64


def owner(namespace: str, name: str, uid: str) -> Owner:
    return Owner(API_VERSION, SERVING_KIND, namespace, name, uid)


@dataclass(frozen=True)
class ServingInputs:
    """Everything the objects depend on, resolved by the controller."""

    owner: Owner
    spec: ServingDeploymentSpec
    model_uri: str
    model: ModelShape
    slice: TpuSlice
    # Changes when the same URI holds a new model (a FineTuneJob that ran again): it rolls the pods.
    model_revision: str = ""
    # The largest spec.lora.rank of the FineTuneJobs spec.adapters references (None when none is known).
    adapter_job_rank: int | None = None
    # The operator's default StorageClass for the volumes a spec does not give one (the chart's Hyperdisk class).
    storage_class: str | None = None

    @property
    def name(self) -> str:
        return self.owner.name

    @property
    def namespace(self) -> str:
        return self.owner.namespace


@dataclass(frozen=True)
class ServingNames:
    deployment: str
    service: str
    xla_cache: str
    model: str
    monitor: str


def names(name: str) -> ServingNames:
    """Deterministic child names. The Service takes the plain name so that the endpoint reads naturally."""
    vllm = child_name(name, "vllm")
    return ServingNames(
        deployment=vllm,
        service=name,
        xla_cache=child_name(name, "xla-cache"),
        model=child_name(name, "model"),
        monitor=vllm,
    )


def name_errors(name: str) -> list[FieldError]:
    """The Service takes the object's name, so it must be a DNS-1035 label."""
    if len(name) > MAX_NAME or not _DNS_1035.fullmatch(name):
        return [
            FieldError(
                "metadata.name",
                f"{name!r} names the Service too, so it must be a DNS label: at most {MAX_NAME} lowercase "
                "letters, digits and '-', starting with a letter and ending with a letter or digit",
            )
        ]
    return []


def endpoint(name: str, namespace: str) -> str:
    """The OpenAI-compatible base URL inside the cluster."""
    return f"http://{names(name).service}.{namespace}.svc:{VLLM_PORT}/v1"


def served_model_name(name: str, spec: ServingDeploymentSpec) -> str:
    return spec.vllm.served_model_name or name


def selector_labels(name: str) -> dict[str, str]:
    """The Deployment's selector: immutable once created, so only labels that never change for a name."""
    return {LABEL_SERVING: label_value(name), LABEL_COMPONENT: COMPONENT}


def labels(o: Owner) -> dict[str, str]:
    return standard_labels(o, LABEL_SERVING, APP, COMPONENT)


def _metadata(inp: ServingInputs, name: str, owned: bool = True) -> Obj:
    meta = metadata(inp.owner, name, labels(inp.owner))
    if not owned:
        del meta["ownerReferences"]
    return meta


def lora_enabled(spec: ServingDeploymentSpec) -> bool:
    """vLLM serves LoRA adapters when the spec lists some, or names a maxLoraRank (which keeps the flags, and
    so the pods, the same when the first adapter is added later)."""
    return bool(spec.adapters) or spec.vllm.lora.max_lora_rank is not None


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts for --max-lora-rank that holds `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")


def max_lora_rank(inp: ServingInputs) -> int:
    """spec.vllm.lora.maxLoraRank, else the largest referenced job's rank, and 64 for URI adapters (whose
    rank nothing records ahead), rounded up to a rank vLLM accepts."""
    explicit = inp.spec.vllm.lora.max_lora_rank
    if explicit is not None:
        return vllm_lora_rank(explicit)
    ranks = [inp.adapter_job_rank] if inp.adapter_job_rank else []
    if any(a.uri is not None for a in inp.spec.adapters) or not ranks:
        ranks.append(DEFAULT_URI_LORA_RANK)
    return vllm_lora_rank(max(ranks))


def lora_args(inp: ServingInputs) -> list[str]:
    if not lora_enabled(inp.spec):
        return []
    lora = inp.spec.vllm.lora
    args = ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(max_lora_rank(inp))]
    if lora.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(lora.max_cpu_loras)]
    return args


def vllm_args(inp: ServingInputs) -> list[str]:
    """`vllm serve` arguments after the subcommand: the model path first, extra args last (so they win)."""
    v = inp.spec.vllm
    args = [
        v.model_path,
        "--served-model-name",
        served_model_name(inp.name, inp.spec),
        "--tensor-parallel-size",
        str(v.tensor_parallel_size),
        "--max-model-len",
        str(v.max_model_len),
        "--kv-cache-dtype",
        v.kv_cache_dtype,
    ]
    if v.max_num_seqs is not None:
        args += ["--max-num-seqs", str(v.max_num_seqs)]
    batched = v.max_num_batched_tokens
    if inp.model.multimodal:
        # vLLM-TPU requires it for multimodal models (Gemma 4's vision tower); each item is then batched whole.
        args.append("--disable_chunked_mm_input")
        batched = batched or MULTIMODAL_MAX_NUM_BATCHED_TOKENS
    if batched is not None:
        args += ["--max-num-batched-tokens", str(batched)]
    args += lora_args(inp)
    args += ["--host", "0.0.0.0", "--port", str(VLLM_PORT)]
    return args + list(v.extra_args)


def _http_get(path: str) -> Obj:
    return {"path": path, "port": VLLM_PORT}


def probes() -> dict[str, Obj]:
    """Startup allows the whole compile budget; after that readiness gates traffic and liveness restarts a
    wedged server."""
    return {
        "startupProbe": {
            "httpGet": _http_get(HEALTH_PATH),
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(STARTUP_BUDGET_SECONDS / STARTUP_PROBE_PERIOD_SECONDS),
        },
        "readinessProbe": {
            "httpGet": _http_get(HEALTH_PATH),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": _http_get(HEALTH_PATH),
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 5,
        },
    }


def vllm_env(lora: bool = False) -> list[Obj]:
    env = [
        {"name": "VLLM_XLA_CACHE_PATH", "value": XLA_CACHE_MOUNT},
        {"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": str(STARTUP_BUDGET_SECONDS)},
        # The model is a local directory: nothing should reach out to the Hugging Face Hub.
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        # vLLM otherwise reports usage statistics to its authors (and writes them under HOME).
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
    ]
    if lora:
        # The operator loads and unloads adapters through /v1/load_lora_adapter while the server runs.
        env.append({"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"})
    return env


def uncommitted_base(spec: ServingDeploymentSpec) -> bool:
    """A base for adapters named by URI is usually a checkpoint uploaded as it is, without `_COMPLETE`; a merged
    model (a FineTuneJob's output, or a URI served without adapters) must be committed. A base that has the
    marker is checked against its manifest either way."""
    return spec.model.uri is not None and lora_enabled(spec)


def fetch_args(inp: ServingInputs) -> list[str]:
    # The termination log is passed, not defaulted, so that every path the container writes is in its args.
    args = [
        "--model-uri",
        inp.model_uri,
        "--target-dir",
        inp.spec.vllm.model_path,
        "--termination-log",
        TERMINATION_LOG,
    ]
    if uncommitted_base(inp.spec):
        args.append("--uncommitted-base")
    return args


def adapters_sidecar(inp: ServingInputs, model_id: str) -> Obj:
    """Fetches adapters into the shared volume when the operator asks (port 8001), checking each against the
    base in the model volume. It takes no per-adapter arguments, so adapters change without a new template."""
    return {
        "name": ADAPTERS_CONTAINER,
        "image": FETCH_IMAGE,
        "command": ["python", "-m", "tpuforge_workloads.serve.adapters"],
        "args": [
            "--model-dir",
            inp.spec.vllm.model_path,
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
        "volumeMounts": [
            {"name": "model", "mountPath": inp.spec.vllm.model_path, "readOnly": True},
            {"name": "adapters", "mountPath": ADAPTERS_DIR},
        ],
    }


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
    vllm: Obj = {
        "name": "vllm",
        "image": spec.vllm.image,
        "command": ["vllm", "serve"],
        "args": vllm_args(inp),
        "env": vllm_env(lora),
        # vLLM writes no termination message: the tail of its log says why it stopped.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        "resources": tpu_resources(inp.slice, resources.tpu_server_requests(spec.tpu.resources, inp.model)),
        "volumeMounts": [
            {"name": "model", "mountPath": model_dir, "readOnly": True},
            {"name": "xla-cache", "mountPath": XLA_CACHE_MOUNT},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        **probes(),
    }
    fetch: Obj = {
        "name": "fetch-model",
        "image": FETCH_IMAGE,
        "command": ["python", "-m", "tpuforge_workloads.serve.fetch"],
        "args": fetch_args(inp),
        "resources": resources.FETCH_RESOURCES,
        "volumeMounts": [{"name": "model", "mountPath": model_dir}],
        "terminationMessagePath": TERMINATION_LOG,
    }
    volumes: list[Obj] = [
        model_volume(inp),
        {"name": "xla-cache", "persistentVolumeClaim": {"claimName": names(inp.name).xla_cache}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if spec.model_storage.medium == "NodeLocal":
        # The copy lives on the node's disk: say so, so that the scheduler and the kubelet's eviction count it.
        vllm["resources"] = {
            **vllm["resources"],
            "requests": {**vllm["resources"]["requests"], **local_model_request(inp)},
        }
    containers = [vllm]
    if lora:
        # Same path in both containers: the path the sidecar reports is the lora_path vLLM loads.
        vllm["volumeMounts"].append({"name": "adapters", "mountPath": ADAPTERS_DIR, "readOnly": True})
        containers.append(adapters_sidecar(inp, inp.model.id))
        volumes.append({"name": "adapters", "emptyDir": {}})
    pod: Obj = {
        **tpu_scheduling(inp.slice, spec.tpu.spot, spec.tpu.spot_grace_seconds),
        "initContainers": [fetch],
        "containers": containers,
        "volumes": volumes,
    }
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    # Neither vLLM nor the model fetch talks to the Kubernetes API (GCS access is Workload Identity's).
    root = frozenset({"vllm"}) if spec.tpu.run_as_root else frozenset()
    pod = locked_down(pod, api_access=False, root_containers=root)
    annotations = {ANNOTATION_MODEL_URI: inp.model_uri, **scrape_annotations()}
    if inp.model_revision:
        annotations[ANNOTATION_MODEL_REVISION] = inp.model_revision
    return {"metadata": {"labels": labels(inp.owner), "annotations": annotations}, "spec": pod}


def surges(spec: ServingDeploymentSpec) -> bool:
    """Whether a new pod may start beside the old ones. It lands on another TPU VM (the old pod holds every chip
    of its own), so every volume it shares with them must attach to many nodes; a ReadWriteOnce disk cannot
    (GKE: Multi-Attach error), and a surge pod would wait for it for ever while the old pod is never removed."""
    return spec.xla_cache.access_mode == "ReadWriteMany" and spec.model_storage.medium == "NodeLocal"


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
        "metadata": _metadata(inp, names(inp.name).deployment),
        "spec": {
            "replicas": inp.spec.replicas,
            "selector": {"matchLabels": selector_labels(inp.name)},
            "strategy": strategy(inp.spec),
            # A rollout that has not become ready within the compile budget is reported as stalled.
            "progressDeadlineSeconds": STARTUP_BUDGET_SECONDS + 600,
            "template": pod_template(inp),
        },
    }


def service(inp: ServingInputs) -> Obj:
    meta = _metadata(inp, names(inp.name).service)
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
        "metadata": _metadata(inp, name, owned=owned),
        "spec": spec,
    }


def xla_cache_pvc(inp: ServingInputs) -> Obj:
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
    return {"name": "model", "persistentVolumeClaim": {"claimName": names(inp.name).model}}


def local_model_request(inp: ServingInputs) -> dict[str, str]:
    return {"ephemeral-storage": model_size(inp)}


def model_pvc(inp: ServingInputs) -> Obj | None:
    """The model's disk (medium Disk): the fetched copy survives pod restarts, so a restarted or rescheduled pod
    skips the download; collected with the ServingDeployment."""
    storage = inp.spec.model_storage
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
        "metadata": _metadata(inp, names(inp.name).monitor),
        "spec": {"selector": {"matchLabels": selector_labels(inp.name)}, "endpoints": [_monitor_endpoint()]},
    }


def service_monitor(inp: ServingInputs) -> Obj:
    """Prometheus Operator."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _metadata(inp, names(inp.name).monitor),
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
