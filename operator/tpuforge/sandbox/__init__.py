"""The sandbox: a local Kubernetes 1.20 control plane, fake GCS and emulated GKE TPU nodes (`Sandbox`)."""

from tpuforge.sandbox.config import NodePool, Ports, SandboxConfig
from tpuforge.sandbox.sandbox import ComponentStatus, Sandbox, SandboxError, wait_for

__all__ = ["ComponentStatus", "NodePool", "Ports", "Sandbox", "SandboxConfig", "SandboxError", "wait_for"]
