"""The sandbox's custom metrics pieces that need no cluster: the node agent's service discovery labels pods as
Prometheus's Kubernetes discovery does, the scrape configuration passes promtool, and the adapter's rules are
the chart values' (examples/autoscaling/prometheus-adapter-values.yaml). The whole path, from vLLM's queue to
an HPA scaling a ServingDeployment, runs in tests/pipelines/test_serving_stream.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tpuforge_sandbox import custommetrics
from tpuforge_sandbox.config import SandboxConfig, repo_root


def pod(name: str, ip: str | None, annotations: dict[str, str], deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "serving", "annotations": annotations, "labels": {"app": "x"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"phase": "Running", **({"podIP": ip} if ip else {})}
    spec = {"nodeName": "v6e-8-0", "containers": [{"name": "vllm", "ports": [{"containerPort": 8000}]}]}
    return {"metadata": meta, "status": status, "spec": spec}


def test_pods_are_labelled_as_kubernetes_discovery_labels_them() -> None:
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": "8000", "prometheus.io/path": "/metrics"}
    pods = [pod("chat-1", "127.0.0.1", scrape), pod("pending", None, scrape), pod("gone", "127.0.0.1", scrape, True)]
    (target,) = custommetrics.pod_targets(pods)
    assert target["targets"] == ["127.0.0.1:8000"]
    labels = target["labels"]
    assert labels["__meta_kubernetes_namespace"] == "serving"
    assert labels["__meta_kubernetes_pod_name"] == "chat-1"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == "true"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_port"] == "8000"
    assert labels["__meta_kubernetes_pod_label_app"] == "x"


def test_the_scrape_configuration_passes_promtool(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.fail("no promtool: run `make prometheus`", pytrace=False)
    cfg = SandboxConfig(dir=str(tmp_path))
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(custommetrics.prometheus_config(cfg)))
    out = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_adapters_rules_are_the_chart_values_and_name_vllms_gauges() -> None:
    values = yaml.safe_load((repo_root() / custommetrics.ADAPTER_VALUES).read_text())
    assert values["rules"]["default"] is False
    (rule,) = custommetrics.rules()["rules"]
    assert rule == values["rules"]["custom"][0]
    for gauge in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"):
        assert gauge in rule["seriesQuery"]
    assert (rule["name"]["matches"], rule["name"]["as"]) == ("^vllm[:_](.*)$", "vllm_${1}")
