"""The sandbox as one object: `Sandbox(dir).up()` starts etcd, kube-apiserver, kube-controller-manager, the
JobSet and Kueue controllers, fake-gcs-server, the node agent, and Prometheus with the Prometheus adapter (the
custom metrics API) on loopback; `down()` stops exactly those processes."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpuforge_sandbox import addons as addon_procs
from tpuforge_sandbox import controlplane as cp
from tpuforge_sandbox import custommetrics
from tpuforge_sandbox.config import (
    DEFAULT_BUCKET,
    DEFAULT_NODES,
    Binaries,
    NodePool,
    Ports,
    SandboxConfig,
    default_dir,
    parse_node_pools,
    repo_root,
)
from tpuforge_sandbox.gcs import create_bucket, gcs_argv, gcs_env, wait_gcs
from tpuforge_sandbox.kubeapi import Kube, new_api_client
from tpuforge_sandbox.nodes import EMULATED_LABEL, PREEMPT_ANNOTATION, node_ready
from tpuforge_sandbox.pki import Pki
from tpuforge_sandbox.procs import Daemon, cmdline, port_free

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
GCS = "fake-gcs-server"
NODE_AGENT = "node-agent"
JOBSET = addon_procs.JOBSET
KUEUE = addon_procs.KUEUE
PROMETHEUS = custommetrics.PROMETHEUS
ADAPTER = custommetrics.ADAPTER
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER, JOBSET, KUEUE, GCS, NODE_AGENT, PROMETHEUS, ADAPTER)
# Not started by up(): `tpuforge demo` runs the operator beside the sandbox with a pidfile and log of its own,
# so that status shows it and down() stops it (first, while the apiserver it talks to is still there).
OPERATOR = "operator"


class SandboxError(RuntimeError):
    """A sandbox command could not do its job; the message says why and what to do."""


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    state: str  # running | stopped | external
    pid: int | None
    detail: str  # address or log file


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until `predicate()` is truthy and return its value; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Sandbox:
    """A local Kubernetes control plane with JobSet and Kueue, GCS and emulated GKE TPU nodes in one state
    directory.

    Values left as None come from the running sandbox (its sandbox.json), else from the environment
    (TPUFORGE_SANDBOX_*), else the defaults. `attach=True` ties every process to the caller's life (tests).
    """

    def __init__(
        self,
        dir: Path | str | None = None,
        ports: Ports | None = None,
        nodes: str | list[NodePool] | None = None,
        bucket: str | None = None,
        gcs_url: str | None = None,
        crds_dir: Path | str | None = None,
        attach: bool = False,
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        root = Path(dir or default_dir()).expanduser().resolve()
        saved = SandboxConfig.load(root) if (root / "sandbox.json").exists() else None
        pools = parse_node_pools(nodes) if isinstance(nodes, str) else nodes
        self._requested = {"ports": ports, "pools": pools, "bucket": bucket, "external_gcs_url": gcs_url}
        base = saved or SandboxConfig(
            dir=str(root),
            ports=Ports.from_env(),
            pools=parse_node_pools(DEFAULT_NODES),
            bucket=DEFAULT_BUCKET,
        )
        self.config = replace(
            base,
            dir=str(root),
            ports=ports or base.ports,
            pools=pools if pools is not None else base.pools,
            bucket=bucket or base.bucket,
            external_gcs_url=gcs_url if gcs_url is not None else base.external_gcs_url,
        )
        self.crds_dir = Path(crds_dir or os.environ.get("TPUFORGE_SANDBOX_CRDS") or repo_root() / "crds")
        self.attach = attach
        self.log = log

    # -- where things are ------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.config.root

    @property
    def kubeconfig(self) -> Path:
        return self.config.kubeconfig

    @property
    def apiserver_url(self) -> str:
        return self.config.apiserver_url

    @property
    def gcs_url(self) -> str:
        return self.config.gcs_url

    @property
    def bucket(self) -> str:
        return self.config.bucket

    @property
    def bin_dir(self) -> Path:
        """Where the control plane's binaries are, kubectl of the same version among them."""
        return Binaries.locate().dir

    @property
    def kubectl(self) -> str:
        return Binaries.locate().kubectl

    def env(self) -> dict[str, str]:
        """What a shell (or a subprocess) needs to use this sandbox: KUBECONFIG, the GCS emulator env, and
        PATH with the sandbox's kubectl first."""
        return {
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "KUBECONFIG": str(self.kubeconfig),
            "TPUFORGE_SANDBOX_DIR": str(self.dir),
            **gcs_env(self.gcs_url),
        }

    def api_client(self) -> client.ApiClient:
        """A kubernetes ApiClient for the admin user (never reads $KUBECONFIG)."""
        return new_api_client(self.kubeconfig)

    def daemon(self, name: str) -> Daemon:
        return Daemon(name, self.config.run_dir, self.config.logs_dir, marker=str(self.dir))

    def pod_log(self, namespace: str, pod: str, container: str) -> Path:
        return self.config.pods_dir / namespace / pod / "logs" / f"{container}.log"

    # -- lifecycle --------------------------------------------------------------------------------------
    def running(self) -> dict[str, int]:
        pids = {name: self.daemon(name).pid() for name in COMPONENTS}
        return {name: pid for name, pid in pids.items() if pid is not None}

    def is_up(self) -> bool:
        metrics = metrics_binaries() is not None
        expected = [
            c
            for c in COMPONENTS
            if not (c == GCS and self.config.external_gcs_url) and (metrics or c not in (PROMETHEUS, ADAPTER))
        ]
        running = self.running()
        return all(c in running for c in expected) and cp.apiserver_ready(self.config)

    def up(self, timeout: float = 120.0) -> bool:
        """Start whatever is not running. Returns False when everything was already up."""
        cfg = self.config
        running = self.running()
        if running:
            self._check_same_config()
        crd_files = self._crd_files()
        bins = Binaries.locate()
        if self.is_up():
            with self.api_client() as api:  # CRDs may have changed since it started
                install_crds(api, crd_files, timeout)
                self._install_addons(api, bins, timeout)
            self.log(f"sandbox already up in {self.dir}")
            return False
        self._check_ports(running)
        cfg.root.mkdir(parents=True, exist_ok=True)
        Pki(cfg.pki).ensure()
        cfg.save()
        cp.write_admin_kubeconfig(cfg)
        started: list[str] = []
        try:
            deadline = time.monotonic() + timeout
            if ETCD not in running:
                self._start(ETCD, cp.etcd_argv(cfg, bins), started)
            if GCS not in running and not cfg.external_gcs_url:
                (cfg.root / "gcs").mkdir(exist_ok=True)
                self._start(GCS, gcs_argv(cfg.root / "gcs", cfg.ports.gcs), started)
            self._await(ETCD, lambda: cp.etcd_healthy(cfg), deadline)
            if APISERVER not in running:
                self._start(APISERVER, cp.apiserver_argv(cfg, bins), started)
            self._await(APISERVER, lambda: cp.apiserver_ready(cfg), deadline)
            if CONTROLLER_MANAGER not in running:
                self._start(CONTROLLER_MANAGER, cp.controller_manager_argv(cfg, bins), started)
            if not wait_gcs(cfg.gcs_url, max(1.0, deadline - time.monotonic()), self._alive(GCS)):
                raise self._failure(GCS, f"fake-gcs-server did not answer on {cfg.gcs_url}")
            create_bucket(cfg.gcs_url, cfg.bucket)
            with self.api_client() as api:
                install_crds(api, crd_files, max(1.0, deadline - time.monotonic()))
                self._install_addons(api, bins, max(1.0, deadline - time.monotonic()), running, started)
                self._start_custom_metrics(api, deadline, running, started)
                if NODE_AGENT not in running:
                    agent = [sys.executable, "-m", "tpuforge_sandbox.agent", "--dir", str(cfg.root)]
                    self._start(NODE_AGENT, agent, started)
                self._await(
                    CONTROLLER_MANAGER,
                    lambda: Kube(api).read_service_account("default", "default"),
                    deadline,
                    "the default ServiceAccount",
                )
                expected = sum(p.count * (p.tpu.hosts if p.tpu else 1) for p in cfg.pools)
                self._await(
                    NODE_AGENT, lambda: _ready_nodes(api) >= expected, deadline, f"{expected} emulated nodes Ready"
                )
        except BaseException:
            for name in reversed(started):
                self.daemon(name).stop()
            raise
        self.log(f"sandbox up in {self.dir} ({', '.join(started) or 'nothing new'} started)")
        return True

    def down(self, purge: bool = False) -> list[str]:
        """Stop the processes this sandbox started, and the demo's operator (that first, then the node agent,
        so pods end while the apiserver still records it). `purge` also deletes the state directory. Returns
        what was stopped."""
        stopped = []
        order = (OPERATOR, NODE_AGENT, ADAPTER, PROMETHEUS, KUEUE, JOBSET, CONTROLLER_MANAGER, APISERVER, ETCD, GCS)
        for name in order:
            # The agent gives pods their grace period (up to 15 s, as on GKE) before it exits.
            if self.daemon(name).stop(timeout=40.0 if name == NODE_AGENT else 10.0):
                stopped.append(name)
        if purge and (self.dir / "sandbox.json").exists():
            shutil.rmtree(self.dir)
        return stopped

    def status(self) -> list[ComponentStatus]:
        cfg = self.config
        addr = {
            ETCD: f"http://127.0.0.1:{cfg.ports.etcd}",
            APISERVER: cfg.apiserver_url,
            CONTROLLER_MANAGER: "",
            JOBSET: f"https://127.0.0.1:{cfg.ports.jobset_webhook} (webhooks)",
            KUEUE: f"https://127.0.0.1:{cfg.ports.kueue_webhook} (webhooks)",
            GCS: cfg.gcs_url,
            NODE_AGENT: f"https://127.0.0.1:{cfg.ports.node_agent}",
            PROMETHEUS: custommetrics.prometheus_url(cfg),
            ADAPTER: f"https://127.0.0.1:{cfg.ports.metrics_adapter} ({custommetrics.API_GROUP})",
        }
        out = []
        for name in COMPONENTS:
            if name == GCS and cfg.external_gcs_url:
                out.append(ComponentStatus(name, "external", None, cfg.external_gcs_url))
                continue
            pid = self.daemon(name).pid()
            out.append(ComponentStatus(name, "running" if pid else "stopped", pid, addr[name]))
        operator = self.daemon(OPERATOR)
        pid = operator.pid()
        if pid is not None:
            out.append(ComponentStatus(OPERATOR, "running", pid, str(operator.log)))
        return out

    def preempt(self, node: str, grace: int | None = None, wait: bool = True, timeout: float = 120.0) -> None:
        """Simulate a GKE Spot preemption of `node`: the node agent marks its pods DisruptionTarget, sends
        SIGTERM, waits the grace period (at most 15 s unless `grace` says otherwise), kills what is left and
        fails the pods with reason Terminated. `wait` blocks until the agent has finished."""
        with self.api_client() as api:
            kube = Kube(api)
            n = kube.read_node(node)
            if n is None:
                names = ", ".join(x["metadata"]["name"] for x in kube.list_nodes(""))
                raise SandboxError(f"no node {node!r}; nodes: {names}")
            if (n["metadata"].get("labels") or {}).get(EMULATED_LABEL) != "true":
                raise SandboxError(f"node {node!r} is not an emulated sandbox node")
            value = f"{time.time():.3f}" + (f"/{grace}" if grace is not None else "")
            kube.patch_node(node, {"metadata": {"annotations": {PREEMPT_ANNOTATION: value}}})
            if wait:

                def done() -> bool:
                    current = kube.read_node(node) or {"metadata": {}}
                    return PREEMPT_ANNOTATION not in (current["metadata"].get("annotations") or {})

                wait_for(done, timeout, f"the node agent to preempt {node}", interval=0.3)

    # -- helpers ----------------------------------------------------------------------------------------
    def _start_custom_metrics(
        self, api: client.ApiClient, deadline: float, running: dict[str, int], started: list[str]
    ) -> None:
        """Prometheus, then the Prometheus adapter, then the APIService that routes custom.metrics.k8s.io to it.
        Without the adapter's build (or Debian's Prometheus) the sandbox runs without custom metrics, and no
        APIService is left to point at nothing (an unavailable aggregated API stalls namespace deletion)."""
        cfg, kube = self.config, Kube(api)
        docs = custommetrics.registration(cfg)
        binaries = metrics_binaries()
        if binaries is None:
            kube.delete(f"/apis/apiregistration.k8s.io/v1/apiservices/{docs[1]['metadata']['name']}")
            self.log(
                "no custom metrics: the Prometheus adapter is not built (`bash scripts/build-prometheus-adapter.sh`)"
                " or `prometheus` is not installed (`make prometheus`)"
            )
            return
        apiserver = running.get(APISERVER)
        if apiserver is not None and "--proxy-client-cert-file" not in cmdline(apiserver):
            # An apiserver started before the sandbox had custom metrics has no aggregation layer to reach them.
            kube.delete(f"/apis/apiregistration.k8s.io/v1/apiservices/{docs[1]['metadata']['name']}")
            self.log("no custom metrics: the apiserver predates them; `tpuforge sandbox down` and `up` to add them")
            return
        prometheus, adapter = binaries
        if PROMETHEUS not in running:
            self._start(PROMETHEUS, custommetrics.prometheus_argv(cfg, prometheus), started)
        if ADAPTER not in running:
            self._start(ADAPTER, custommetrics.adapter_argv(cfg, adapter), started)
        kube.ensure_namespace(custommetrics.NAMESPACE)
        plurals = {"Service": "services", "APIService": "apiservices"}
        for doc in docs:
            kube.server_side_apply(doc, plurals.get(doc["kind"], doc["kind"].lower() + "s"))
        self._await(PROMETHEUS, lambda: custommetrics.prometheus_ready(cfg), deadline)
        self._await(ADAPTER, lambda: custommetrics.adapter_serving(cfg), deadline)

    def _install_addons(
        self,
        api: client.ApiClient,
        bins: Binaries,
        timeout: float,
        running: dict[str, int] | None = None,
        started: list[str] | None = None,
    ) -> None:
        """JobSet's and Kueue's CRDs, then their controllers (when `started` is given and they are not
        running), then their webhook configurations: a webhook that fails closed is installed only once its
        server answers."""
        cfg = self.config
        kube = Kube(api)
        kube.ensure_namespace(addon_procs.KUEUE_NAMESPACE)
        ca_pem = Pki(cfg.pki).ca_crt.read_bytes()
        deadline = time.monotonic() + timeout
        docs = {a: list(addon_procs.manifests(a, bins, ca_pem)) for a in addon_procs.addons(cfg)}
        crds = [d for ds in docs.values() for d in ds if d["kind"] == "CustomResourceDefinition"]
        for doc in crds:
            kube.apply_crd(doc)
        wait_for(
            lambda: all(kube.crd_established(d["metadata"]["name"]) for d in crds),
            max(1.0, deadline - time.monotonic()),
            "JobSet's and Kueue's CRDs to be Established",
        )
        for addon, ds in docs.items():
            if started is not None and addon.name not in (running or {}):
                self._start(addon.name, addon_procs.argv(addon, cfg, bins), started, addon_procs.env(addon, cfg))
            self._await(addon.name, functools.partial(addon_procs.ready, addon), deadline, f"{addon.name} to serve")
            for doc in ds:
                if doc["kind"] != "CustomResourceDefinition":
                    kube.apply_webhook_configuration(doc)

    def _check_same_config(self) -> None:
        saved = SandboxConfig.load(self.dir) if (self.dir / "sandbox.json").exists() else None
        if saved is None:
            return
        for key, want in self._requested.items():
            have = getattr(saved, key)
            if want is not None and want != have:
                raise SandboxError(
                    f"the sandbox in {self.dir} is running with {key}={have}, not {want}: run "
                    "`tpuforge sandbox down` first to change it"
                )

    def _crd_files(self) -> list[Path]:
        files = sorted(self.crds_dir.glob("*.yaml"))
        if not files:
            raise SandboxError(
                f"no CRDs in {self.crds_dir}: run `make crds` (tpuforge crds --out crds) to generate them"
            )
        return files

    def _check_ports(self, running: dict[str, int]) -> None:
        p = self.config.ports
        wanted = {
            ETCD: [("etcd", p.etcd, "--etcd-port"), ("etcd peer", p.etcd_peer, "--etcd-peer-port")],
            APISERVER: [("kube-apiserver", p.apiserver, "--apiserver-port")],
            GCS: [] if self.config.external_gcs_url else [("fake-gcs-server", p.gcs, "--gcs-port")],
            NODE_AGENT: [("node agent", p.node_agent, "--node-agent-port")],
            JOBSET: [
                ("JobSet webhook", p.jobset_webhook, "--jobset-webhook-port"),
                ("JobSet health probe", p.jobset_health, "--jobset-health-port"),
            ],
            KUEUE: [
                ("Kueue webhook", p.kueue_webhook, "--kueue-webhook-port"),
                ("Kueue health probe", p.kueue_health, "--kueue-health-port"),
            ],
            PROMETHEUS: [("Prometheus", p.prometheus, "--prometheus-port")],
            ADAPTER: [("Prometheus adapter", p.metrics_adapter, "--metrics-adapter-port")],
        }
        for component, ports in wanted.items():
            if component in running:
                continue
            for what, port, flag in ports:
                if not port_free(port):
                    env = f"TPUFORGE_SANDBOX_{flag[2:-5].upper().replace('-', '_')}_PORT"
                    raise SandboxError(
                        f"port {port} for the {what} is already in use on 127.0.0.1: stop what listens "
                        f"there (another sandbox? `tpuforge sandbox status`), or choose another port with "
                        f"{flag} or {env}"
                    )

    def _start(self, name: str, argv: list[str], started: list[str], env: dict[str, str] | None = None) -> None:
        self.log(f"starting {name}")
        self.daemon(name).start(argv, env=env, attach=self.attach)
        started.append(name)

    def _alive(self, name: str) -> Callable[[], bool]:
        if name == GCS and self.config.external_gcs_url:
            return lambda: True
        return lambda: self.daemon(name).pid() is not None

    def _await(self, name: str, ready: Callable[[], Any], deadline: float, what: str = "") -> None:
        alive = self._alive(name)
        what = what or f"{name} to become ready"
        while not ready():
            if not alive():
                raise self._failure(name, f"{name} exited while starting")
            if time.monotonic() > deadline:
                raise self._failure(name, f"timed out waiting for {what}")
            time.sleep(0.2)

    def _failure(self, name: str, msg: str) -> SandboxError:
        d = self.daemon(name)
        return SandboxError(f"{msg}; last lines of {d.log}:\n{d.log_tail()}")


def install_crds(api: client.ApiClient, files: list[Path], timeout: float = 60.0) -> list[str]:
    """Create or replace each CustomResourceDefinition in `files` and wait until all are Established."""
    kube = Kube(api)
    docs = [(str(path), doc) for path in files for doc in yaml.safe_load_all(path.read_text())]
    names = []
    for source, doc in docs:
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        name = doc["metadata"]["name"]
        names.append(name)
        try:
            kube.apply_crd(doc)
        except ApiException as e:
            raise SandboxError(f"{source}: the apiserver rejected CRD {name}: {e.body}") from None
    wait_for(lambda: all(kube.crd_established(n) for n in names), timeout, f"CRDs {', '.join(names)} to be Established")
    return names


def metrics_binaries() -> tuple[str, str] | None:
    """Debian's Prometheus and the Prometheus adapter's build, or None when either is missing."""
    prometheus, adapter = shutil.which("prometheus"), Binaries.prometheus_adapter()
    return (prometheus, str(adapter)) if prometheus and adapter else None


def _ready_nodes(api: client.ApiClient) -> int:
    return sum(1 for n in Kube(api).list_nodes(f"{EMULATED_LABEL}=true") if node_ready(n))
