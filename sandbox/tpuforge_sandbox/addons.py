"""The JobSet and Kueue controllers, as their releases build them, run beside the sandbox's control plane.

Each runs as a process with the admin kubeconfig, no leader election, no metrics server and no certificate
management of its own: its webhook server listens on 127.0.0.1 with a certificate from the sandbox's CA, and
its release's webhook configurations (and Kueue's CRD conversion webhooks) are installed with their
`clientConfig.service` replaced by that loopback URL, since the sandbox has no cluster networking.
"""

from __future__ import annotations

import base64
import copy
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tpuforge_sandbox.config import Binaries, SandboxConfig
from tpuforge_sandbox.pki import Pki

Obj = dict[str, Any]

JOBSET = "jobset-controller"
KUEUE = "kueue-controller"
# Kueue manages only Jobs and JobSets that name a LocalQueue (kueue.x-k8s.io/queue-name): the rest run as
# on a cluster without Kueue.
KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")
KUEUE_NAMESPACE = "kueue-system"
# Kueue v0.17 without its own certificate management loads a metrics certificate at start, even with the
# metrics server off, from a fixed /etc/kueue/metrics/certs (where its chart mounts a Secret); the sandbox's
# build of it reads the directory from this variable instead (scripts/build-control-plane.sh).
KUEUE_METRICS_CERT_DIR = "KUEUE_METRICS_CERT_DIR"


@dataclass(frozen=True)
class Addon:
    """One controller: its process name, its release's manifests and its loopback ports."""

    name: str  # the daemon's name (pidfile, log)
    release: str  # jobset | kueue: the manifests' folder
    webhook_port: int
    health_port: int

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    def config_path(self, cfg: SandboxConfig) -> Path:
        return cfg.root / "addons" / f"{self.release}.yaml"


def addons(cfg: SandboxConfig) -> tuple[Addon, Addon]:
    p = cfg.ports
    return (
        Addon(JOBSET, "jobset", p.jobset_webhook, p.jobset_health),
        Addon(KUEUE, "kueue", p.kueue_webhook, p.kueue_health),
    )


def config(addon: Addon, cert_dir: Path) -> Obj:
    """The controller's configuration file (config.jobset.x-k8s.io or config.kueue.x-k8s.io)."""
    common: Obj = {
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": addon.webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{addon.health_port}"},
    }
    if addon.release == "jobset":
        return {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration", **common}
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
        **common,
    }


def argv(addon: Addon, cfg: SandboxConfig, bins: Binaries) -> list[str]:
    """Write the configuration file and return the command line."""
    path = addon.config_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config(addon, Pki(cfg.pki).webhook_cert_dir(addon.release)), sort_keys=False))
    out = [bins.path(addon.name), f"--config={path}", f"--kubeconfig={cfg.kubeconfig}", "--zap-log-level=info"]
    if addon.release == "kueue":
        # The visibility API is an aggregated apiserver the sandbox does not register; `kubectl get workloads`
        # shows the queue.
        out.append("--feature-gates=VisibilityOnDemand=false")
    return out


def env(addon: Addon, cfg: SandboxConfig) -> dict[str, str] | None:
    """The controller's environment: the caller's, and for Kueue where its metrics certificate is (the webhook
    server's: any certificate will do, as its metrics server is off). None: the caller's as it is."""
    if addon.release != "kueue":
        return None
    return {**os.environ, KUEUE_METRICS_CERT_DIR: str(Pki(cfg.pki).webhook_cert_dir(addon.release))}


def ready(addon: Addon) -> bool:
    """The controller's readiness probe (it turns ready once its webhook server serves)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{addon.health_port}/readyz", timeout=1) as r:
            ok = r.status == 200
    except (OSError, urllib.error.URLError):
        return False
    return ok and webhook_serving(addon)


def webhook_serving(addon: Addon) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        urllib.request.urlopen(addon.webhook_url + "/", timeout=1, context=ctx).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, urllib.error.URLError):
        return False
    return True


def _to_url(client_config: Obj, base_url: str, ca_bundle: str) -> Obj:
    service = client_config.get("service") or {}
    path = service.get("path") or "/"
    return {"url": base_url + path, "caBundle": ca_bundle}


def manifests(addon: Addon, bins: Binaries, ca_pem: bytes) -> Iterator[Obj]:
    """The release's CRDs and webhook configurations, pointed at `addon`'s loopback webhook server. The
    webhook configurations are named after the release (kustomize's namePrefix, as its install does)."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    folder = bins.manifests(addon.release)
    for part in ("crd", "webhook"):
        for doc in yaml.safe_load_all((folder / f"{part}.yaml").read_text()):
            if not doc:
                continue
            doc = copy.deepcopy(doc)
            kind = doc.get("kind")
            if kind == "CustomResourceDefinition":
                webhook = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook")
                if webhook and "clientConfig" in webhook:
                    webhook["clientConfig"] = _to_url(webhook["clientConfig"], addon.webhook_url, ca_bundle)
                yield doc
            elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                doc["metadata"] = {"name": f"{addon.release}-{doc['metadata']['name']}"}
                for hook in doc.get("webhooks") or []:
                    hook["clientConfig"] = _to_url(hook["clientConfig"], addon.webhook_url, ca_bundle)
                yield doc
            # The release's webhook Service has no use without cluster networking.
