"""The sandbox: a local Kubernetes control plane with the JobSet and Kueue controllers, fake GCS and emulated GKE
TPU nodes (`Sandbox`)."""

from tpuforge_sandbox.config import NodePool, Ports, SandboxConfig
from tpuforge_sandbox.sandbox import ComponentStatus, Sandbox, SandboxError, wait_for

__all__ = ["ComponentStatus", "NodePool", "Ports", "Sandbox", "SandboxConfig", "SandboxError", "wait_for"]
