"""Emulated GKE nodes: the Node objects (labels, taints, capacity) for each configured node pool, as GKE
would label a TPU slice's hosts, and their status."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

from tpuforge.api.catalog import TpuSlice
from tpuforge.api.constants import GKE_SPOT, GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, INSTANCE_TYPE, TPU_RESOURCE
from tpuforge_sandbox.config import K8S_VERSION, NodePool

EMULATED_LABEL = "sandbox.tpuforge.dev/emulated"
# Set by `tpuforge sandbox preempt` ("<time>[/<grace seconds>]"); the node agent removes it when done.
PREEMPT_ANNOTATION = "sandbox.tpuforge.dev/preempt"
GKE_NODEPOOL = "cloud.google.com/gke-nodepool"
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
CPU_MACHINE_TYPE = "e2-standard-8"
POD_CAPACITY = 110


@dataclass(frozen=True)
class EmulatedNode:
    name: str
    pool: NodePool
    tpu: TpuSlice | None

    @property
    def chips(self) -> int:
        return self.tpu.chips_per_host if self.tpu else 0

    @property
    def labels(self) -> dict[str, str]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            INSTANCE_TYPE: self.tpu.machine_type if self.tpu else CPU_MACHINE_TYPE,
            GKE_NODEPOOL: self.pool.name,
            EMULATED_LABEL: "true",
        }
        if self.tpu:
            labels[GKE_TPU_ACCELERATOR] = self.tpu.accelerator
            labels[GKE_TPU_TOPOLOGY] = self.tpu.topology
        if self.pool.spot:
            labels[GKE_SPOT] = "true"
        return labels

    @property
    def taints(self) -> list[dict[str, str]]:
        return [dict(TPU_TAINT)] if self.tpu else []

    def manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": {"taints": self.taints},
        }

    def resources(self) -> dict[str, str]:
        res = {"cpu": str(os.cpu_count() or 1), "memory": f"{_mem_kib()}Ki", "pods": str(POD_CAPACITY)}
        if self.tpu:
            res[TPU_RESOURCE] = str(self.chips)
        return res


def emulated_nodes(pools: list[NodePool]) -> list[EmulatedNode]:
    """One node per host of each slice: `v5p-8-0`, and `v5p-16-0-0`, `v5p-16-0-1` for a two-host slice."""
    nodes = []
    for pool in pools:
        tpu = pool.tpu
        hosts = tpu.hosts if tpu else 1
        for i in range(pool.count):
            for h in range(hosts):
                name = f"{pool.name}-{i}" if hosts == 1 else f"{pool.name}-{i}-{h}"
                nodes.append(EmulatedNode(name=name, pool=pool, tpu=tpu))
    return nodes


def node_status(
    node: EmulatedNode,
    now: str,
    agent_port: int,
    ready: bool = True,
    message: str = "node agent is posting ready status",
) -> dict[str, Any]:
    def cond(type_: str, status: str, reason: str, msg: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": msg,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    res = node.resources()
    return {
        "capacity": res,
        "allocatable": res,
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": node.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": agent_port}},
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "emulated"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "emulated"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "emulated"),
            cond("Ready", "True" if ready else "False", "KubeletReady" if ready else "KubeletNotReady", message),
        ],
        "nodeInfo": {
            "machineID": node.name,
            "systemUUID": node.name,
            "bootID": node.name,
            "kernelVersion": platform.release(),
            "osImage": "tpuforge sandbox (emulated GKE node)",
            "containerRuntimeVersion": "sandbox://local-processes",
            "kubeletVersion": K8S_VERSION,
            "kubeProxyVersion": K8S_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def node_ready(node: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _mem_kib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 16 * 1024 * 1024
