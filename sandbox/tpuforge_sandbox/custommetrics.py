"""Custom metrics on the sandbox: Prometheus scrapes the pods that ask for it (`prometheus.io/scrape`, as the
operator's serving pods do) and the Prometheus adapter (sigs.k8s.io/prometheus-adapter, built by
scripts/build-prometheus-adapter.sh) serves what it scrapes as custom.metrics.k8s.io through the apiserver's
aggregation layer, so that a HorizontalPodAutoscaler scales a ServingDeployment on vLLM's own load.

The adapter's rules are the ones a platform team installs with the adapter's Helm chart
(examples/autoscaling/prometheus-adapter-values.yaml): vLLM's per-pod series `vllm:num_requests_waiting`,
`vllm:num_requests_running` and `vllm:kv_cache_usage_perc` become the Pods metrics `vllm_num_requests_waiting`,
`vllm_num_requests_running` and `vllm_kv_cache_usage_perc`.
The adapter listens on 127.0.0.1; its APIService names a Service of type ExternalName (127.0.0.1), which the
aggregator dials by name and verifies against the sandbox's CA.
"""

from __future__ import annotations

import base64
import re
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tpuforge_sandbox.config import SandboxConfig, repo_root
from tpuforge_sandbox.pki import Pki

Obj = dict[str, Any]

PROMETHEUS = "prometheus"
ADAPTER = "prometheus-adapter"
NAMESPACE = "monitoring"  # where the adapter's Service lives, as in the adapter's own deploy manifests
SERVICE = "prometheus-adapter"
API_GROUP = "custom.metrics.k8s.io"
API_VERSION = "v1beta1"
SCRAPE_INTERVAL = "2s"
SD_PATH = "/sd/pods"  # the node agent's HTTP service discovery of the pods it runs
# How often the adapter lists the series it may serve (its default, 10 min, would hide a new metric as long).
RELIST_INTERVAL = "5s"

# The adapter's rules are those the docs give a platform team for the adapter's Helm chart: one source.
ADAPTER_VALUES = Path("examples", "autoscaling", "prometheus-adapter-values.yaml")


def rules() -> Obj:
    """The adapter's configuration file: `rules.custom` of the chart values in ADAPTER_VALUES."""
    values = yaml.safe_load((repo_root() / ADAPTER_VALUES).read_text())
    return {"rules": values["rules"]["custom"]}


def root(cfg: SandboxConfig) -> Path:
    return cfg.root / "metrics"


def prometheus_config(cfg: SandboxConfig) -> Obj:
    """The usual kubernetes-pods scrape job: pods annotated prometheus.io/scrape, at their IP and the
    annotated port and path, labelled with their namespace and name. Debian's Prometheus is built without
    Kubernetes service discovery, so the node agent serves the pods it runs, labelled as Kubernetes discovery
    labels them (pod_targets), through HTTP discovery; the relabelling is the one a cluster's Prometheus uses."""
    meta = "__meta_kubernetes_pod_"
    sd = {
        "url": f"https://127.0.0.1:{cfg.ports.node_agent}{SD_PATH}",
        "refresh_interval": SCRAPE_INTERVAL,
        "tls_config": {"ca_file": str(Pki(cfg.pki).ca_crt)},
    }
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "http_sd_configs": [sd],
                "relabel_configs": [
                    {"source_labels": [f"{meta}annotation_prometheus_io_scrape"], "action": "keep", "regex": "true"},
                    {"source_labels": [f"{meta}phase"], "action": "keep", "regex": "Running"},
                    {
                        "source_labels": [f"{meta}annotation_prometheus_io_path"],
                        "action": "replace",
                        "regex": "(.+)",
                        "target_label": "__metrics_path__",
                    },
                    {
                        "source_labels": [f"{meta}ip", f"{meta}annotation_prometheus_io_port"],
                        "action": "replace",
                        "regex": "(.+);(\\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": [f"{meta}name"], "target_label": "pod"},
                ],
            }
        ],
    }


def pod_targets(pods: list[Obj]) -> list[Obj]:
    """The pods that have an IP as Prometheus's Kubernetes discovery (role: pod) labels them, one target per
    pod (at its first container port), in HTTP discovery's format."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if not ip or meta.get("deletionTimestamp"):
            continue
        ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
        labels = {
            "__meta_kubernetes_namespace": meta.get("namespace", ""),
            "__meta_kubernetes_pod_name": meta.get("name", ""),
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_node_name": (pod.get("spec") or {}).get("nodeName", ""),
        }
        for key, value in (meta.get("annotations") or {}).items():
            labels[f"__meta_kubernetes_pod_annotation_{_label_name(key)}"] = value
        for key, value in (meta.get("labels") or {}).items():
            labels[f"__meta_kubernetes_pod_label_{_label_name(key)}"] = value
        port = ports[0]["containerPort"] if ports else 80
        out.append({"targets": [f"{ip}:{port}"], "labels": labels})
    return out


def _label_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def prometheus_argv(cfg: SandboxConfig, binary: str) -> list[str]:
    d = root(cfg)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "prometheus.yml"
    path.write_text(yaml.safe_dump(prometheus_config(cfg), sort_keys=False))
    return [
        binary,
        f"--config.file={path}",
        f"--storage.tsdb.path={d / 'prometheus-data'}",
        "--storage.tsdb.retention.time=2h",
        f"--web.listen-address=127.0.0.1:{cfg.ports.prometheus}",
        "--log.level=warn",
    ]


def prometheus_url(cfg: SandboxConfig) -> str:
    return f"http://127.0.0.1:{cfg.ports.prometheus}"


def adapter_argv(cfg: SandboxConfig, binary: str) -> list[str]:
    d = root(cfg)
    d.mkdir(parents=True, exist_ok=True)
    rules_file = d / "adapter-rules.yaml"
    rules_file.write_text(yaml.safe_dump(rules(), sort_keys=False))
    certs = Pki(cfg.pki).serving_cert_dir(ADAPTER, service_names())
    kubeconfig = str(cfg.kubeconfig)
    return [
        binary,
        f"--config={rules_file}",
        f"--prometheus-url={prometheus_url(cfg)}",
        f"--metrics-relist-interval={RELIST_INTERVAL}",
        "--bind-address=127.0.0.1",
        f"--secure-port={cfg.ports.metrics_adapter}",
        f"--tls-cert-file={certs / 'tls.crt'}",
        f"--tls-private-key-file={certs / 'tls.key'}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--v=1",
    ]


def service_names() -> tuple[str, ...]:
    return (f"{SERVICE}.{NAMESPACE}.svc", f"{SERVICE}.{NAMESPACE}.svc.cluster.local")


def prometheus_ready(cfg: SandboxConfig) -> bool:
    try:
        with urllib.request.urlopen(f"{prometheus_url(cfg)}/-/ready", timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def adapter_serving(cfg: SandboxConfig) -> bool:
    """The adapter's secure port answers (any HTTP status: it serves)."""
    ctx = ssl.create_default_context(cafile=str(Pki(cfg.pki).ca_crt))
    try:
        urllib.request.urlopen(f"https://127.0.0.1:{cfg.ports.metrics_adapter}/healthz", timeout=1, context=ctx)
    except urllib.error.HTTPError:
        return True
    except (OSError, urllib.error.URLError):
        return False
    return True


def registration(cfg: SandboxConfig) -> list[Obj]:
    """The Service (an ExternalName of 127.0.0.1: the sandbox has no cluster networking, and an Endpoints
    address may not be loopback) and the APIService that route custom.metrics.k8s.io to the adapter, and the
    RBAC the HPA controller needs to read it (as the adapter's deploy manifests grant it)."""
    port = cfg.ports.metrics_adapter
    ca = base64.b64encode(Pki(cfg.pki).ca_crt.read_bytes()).decode()
    reader = "custom-metrics-server-resources"
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "127.0.0.1", "ports": [{"name": "https", "port": port}]},
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{API_VERSION}.{API_GROUP}"},
            "spec": {
                "group": API_GROUP,
                "version": API_VERSION,
                "service": {"name": SERVICE, "namespace": NAMESPACE, "port": port},
                "caBundle": ca,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": reader},
            "rules": [{"apiGroups": [API_GROUP], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "hpa-controller-custom-metrics"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
            "subjects": [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}],
        },
    ]
