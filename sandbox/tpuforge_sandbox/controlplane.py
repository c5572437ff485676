"""Command lines of etcd, kube-apiserver and kube-controller-manager on loopback, and kubeconfigs."""

from __future__ import annotations

import base64
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from tpuforge_sandbox.config import Binaries, SandboxConfig
from tpuforge_sandbox.pki import FRONT_PROXY_CLIENT, Pki

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.96.0.0/16"
# No scheduler, kubelet, cloud provider or node IPAM here: the node agent plays those parts, and the
# controllers that would fight it (node lifecycle marking the emulated nodes unreachable) or need a cloud or
# a CSI driver stay off. The claim and volume protection controllers run, so a deleted claim that no pod uses
# goes away as on a cluster.
CONTROLLERS = ",".join(
    [
        "*",
        "-node-ipam-controller",
        "-node-lifecycle-controller",
        "-cloud-node-lifecycle-controller",
        "-node-route-controller",
        "-service-lb-controller",
        "-persistentvolume-attach-detach-controller",
        "-persistentvolume-binder-controller",
        "-persistentvolume-expander-controller",
        "-ttl-controller",
        "-bootstrap-signer-controller",
        "-token-cleaner-controller",
        "-certificatesigningrequest-signing-controller",
        "-certificatesigningrequest-approving-controller",
        "-certificatesigningrequest-cleaner-controller",
    ]
)


def etcd_argv(cfg: SandboxConfig, bins: Binaries) -> list[str]:
    p = cfg.ports
    argv = [
        bins.etcd,
        "--name=sandbox",
        f"--data-dir={cfg.root / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{p.etcd}",
        f"--advertise-client-urls=http://127.0.0.1:{p.etcd}",
        f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
        f"--initial-cluster=sandbox=http://127.0.0.1:{p.etcd_peer}",
        "--listen-metrics-urls=",
        "--log-level=warn",
        "--logger=zap",
    ]
    # A sandbox never needs crash durability.
    argv.append("--unsafe-no-fsync")
    return argv


def apiserver_argv(cfg: SandboxConfig, bins: Binaries) -> list[str]:
    pki = Pki(cfg.pki)
    return [
        bins.kube_apiserver,
        f"--etcd-servers=http://127.0.0.1:{cfg.ports.etcd}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={cfg.ports.apiserver}",
        f"--cert-dir={cfg.pki}",
        f"--tls-cert-file={pki.apiserver_crt}",
        f"--tls-private-key-file={pki.apiserver_key}",
        f"--client-ca-file={pki.ca_crt}",
        f"--token-auth-file={pki.tokens_csv}",
        "--authorization-mode=RBAC",
        # The aggregation layer (the custom metrics API that the Prometheus adapter serves): the apiserver proxies
        # to an extension apiserver with a client certificate of the front-proxy CA and passes the user in
        # these headers; the extension apiserver reads the CA and the names from the
        # extension-apiserver-authentication ConfigMap that the apiserver writes. No
        # --enable-aggregator-routing: the adapter's Service is an ExternalName of 127.0.0.1 (an Endpoints
        # address may not be loopback), which the aggregator resolves by name.
        f"--requestheader-client-ca-file={pki.front_proxy_ca_crt}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client_crt}",
        f"--proxy-client-key-file={pki.front_proxy_client_key}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        # The `kubernetes` Service cannot point at a loopback address; nothing in the sandbox needs it.
        "--endpoint-reconciler-type=none",
        # `kubectl logs` reaches the node agent like a kubelet, at the node's InternalIP (127.0.0.1).
        "--kubelet-preferred-address-types=InternalIP",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(cfg: SandboxConfig, bins: Binaries) -> list[str]:
    pki = Pki(cfg.pki)
    return [
        bins.kube_controller_manager,
        f"--kubeconfig={cfg.kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        f"--controllers={CONTROLLERS}",
        # The token controller signs the legacy token Secrets a user asks for; the root CA is what the
        # root-ca-certificate-publisher puts in each namespace's kube-root-ca.crt ConfigMap.
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_crt}",
        # The HorizontalPodAutoscaler controller reads metrics every 2 s, not every 15 s: a load a test makes
        # is seen within seconds (scaling itself keeps its defaults: tolerance, stabilisation windows).
        "--horizontal-pod-autoscaler-sync-period=2s",
        "--profiling=false",
        "--v=1",
    ]


def kubeconfig_yaml(
    server: str, ca_pem: bytes, token: str, name: str = "tpuforge-sandbox", namespace: str | None = None
) -> str:
    context: dict[str, str] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": context}],
        "current-context": name,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_admin_kubeconfig(cfg: SandboxConfig) -> Path:
    pki = Pki(cfg.pki)
    text = kubeconfig_yaml(cfg.apiserver_url, pki.ca_crt.read_bytes(), pki.admin_token())
    tmp = cfg.kubeconfig.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(cfg.kubeconfig)
    return cfg.kubeconfig


def etcd_healthy(cfg: SandboxConfig) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{cfg.ports.etcd}/health", timeout=1) as r:
            return b'"true"' in r.read()
    except OSError:
        return False


def apiserver_ready(cfg: SandboxConfig) -> bool:
    pki = Pki(cfg.pki)
    ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
    req = urllib.request.Request(
        f"{cfg.apiserver_url}/readyz", headers={"Authorization": f"Bearer {pki.admin_token()}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False
