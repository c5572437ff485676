"""What a sandbox is made of: its state directory, ports, binaries and emulated node pools.

`SandboxConfig` is written to `<dir>/sandbox.json` by `up` and read by every other command and by the node
agent, so the running sandbox, not the caller's flags, is the authority once it is up.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpuforge.api.catalog import TPU_SLICES, TpuSlice
from tpuforge.api.constants import GKE_SPOT_GRACE_SECONDS

DEFAULT_BUCKET = "tpuforge"
# A Spot v5p-8 host for training, a v6e-8 host for serving, a CPU node for merges, and the two hosts of a
# Spot v5p-16 slice for multi-host training.
DEFAULT_NODES = "v5p-8:spot=1,v6e-8=1,cpu=1,v5p-16:spot=1"
# GKE gives non-system pods at most 15 s between the preemption notice and SIGKILL.
GKE_SHUTDOWN_GRACE_SECONDS = GKE_SPOT_GRACE_SECONDS


def default_dir() -> Path:
    env = os.environ.get("TPUFORGE_SANDBOX_DIR")
    if env:
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "tpuforge" / "sandbox"


def cache_dir() -> Path:
    env = os.environ.get("TPUFORGE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tpuforge"


def repo_root() -> Path:
    # sandbox/tpuforge_sandbox/config.py -> the checkout root (the sandbox runs from a tpuforge checkout: it
    # reads scripts/, examples/ and the chart)
    return Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the sandbox's servers. Every one can be set by flag or TPUFORGE_SANDBOX_<NAME>_PORT."""

    apiserver: int = 6443
    etcd: int = 2379
    etcd_peer: int = 2380
    gcs: int = 4443
    node_agent: int = 10250  # the kubelet port: serves pod logs to the apiserver
    # JobSet's and Kueue's admission webhooks (the apiserver calls them by URL) and health probes.
    jobset_webhook: int = 9443
    jobset_health: int = 8081
    kueue_webhook: int = 9444
    kueue_health: int = 8082
    # Prometheus (scrapes the pods that ask for it) and the Prometheus adapter (the custom metrics API).
    prometheus: int = 9090
    metrics_adapter: int = 9446

    @classmethod
    def from_env(cls, **overrides: int | None) -> Ports:
        values: dict[str, int] = {}
        for name, default in asdict(cls()).items():
            given = overrides.get(name)
            env = os.environ.get(f"TPUFORGE_SANDBOX_{name.upper()}_PORT")
            values[name] = given if given is not None else int(env) if env else default
        return cls(**values)

    @classmethod
    def free(cls) -> Ports:
        """Ports nobody listens on now, for sandboxes that must not collide (tests)."""
        socks = []
        try:
            for _ in asdict(cls()):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind(("127.0.0.1", 0))
                socks.append(s)
            return cls(*(int(s.getsockname()[1]) for s in socks))
        finally:
            for s in socks:
                s.close()


@dataclass(frozen=True)
class NodePool:
    """`count` emulated nodes of one kind: a TPU slice from the catalog (one node per host) or plain CPU."""

    kind: str  # a TPU_SLICES id or "cpu"
    count: int = 1
    spot: bool = False

    @property
    def tpu(self) -> TpuSlice | None:
        return None if self.kind == "cpu" else TPU_SLICES[self.kind]

    @property
    def name(self) -> str:
        return f"{self.kind}-spot" if self.spot else self.kind


def parse_node_pools(spec: str) -> list[NodePool]:
    """`v5p-8:spot=1,v6e-8=1,cpu=1` -> pools. A count of 0 drops the pool."""
    pools: list[NodePool] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        kind, sep, count_s = item.partition("=")
        kind, _, flag = kind.strip().partition(":")
        if kind != "cpu" and kind not in TPU_SLICES:
            known = ", ".join(["cpu", *sorted(TPU_SLICES)])
            raise ValueError(f"--nodes: unknown node kind {kind!r} in {spec!r}; known: {known}")
        if flag not in ("", "spot"):
            raise ValueError(f"--nodes: unknown option {flag!r} in {item!r}; the only option is ':spot'")
        try:
            count = int(count_s) if sep else 1
        except ValueError:
            raise ValueError(f"--nodes: count in {item!r} is not an integer") from None
        if count < 0:
            raise ValueError(f"--nodes: count in {item!r} must be >= 0")
        if count:
            pools.append(NodePool(kind=kind, count=count, spot=flag == "spot"))
    return pools


def format_node_pools(pools: list[NodePool]) -> str:
    return ",".join(f"{p.kind}{':spot' if p.spot else ''}={p.count}" for p in pools)


def control_plane_versions() -> dict[str, str]:
    """KUBE_VERSION, ETCD_VERSION, JOBSET_VERSION, KUEUE_VERSION and the build's revision BUILD, from the file the
    build script reads."""
    text = (repo_root() / "scripts" / "control-plane-versions.env").read_text()
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


K8S_VERSION = control_plane_versions()["KUBE_VERSION"]


@dataclass(frozen=True)
class Binaries:
    """The control plane's binaries and the JobSet and Kueue releases' manifests, as
    scripts/build-control-plane.sh leaves them in the cache (or in TPUFORGE_K8S_BIN_DIR)."""

    dir: Path

    NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "jobset-controller", "kueue-controller")

    @staticmethod
    def default_dir() -> Path:
        v = control_plane_versions()
        name = (
            f"controlplane-k8s-{v['KUBE_VERSION']}-etcd-{v['ETCD_VERSION']}-jobset-{v['JOBSET_VERSION']}"
            f"-kueue-{v['KUEUE_VERSION']}-build-{v['BUILD']}"
        )
        return cache_dir() / name

    @classmethod
    def locate(cls) -> Binaries:
        """Find the control-plane binaries or say how to get them."""
        bin_dir = Path(os.environ.get("TPUFORGE_K8S_BIN_DIR") or cls.default_dir())
        missing = [n for n in cls.NAMES if not (bin_dir / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{', '.join(missing)} not found in {bin_dir}: run `make setup` (or "
                "`bash scripts/build-control-plane.sh`) once to build them, or set TPUFORGE_K8S_BIN_DIR"
            )
        return cls(bin_dir)

    @staticmethod
    def prometheus_adapter() -> Path | None:
        """The Prometheus adapter as scripts/build-prometheus-adapter.sh leaves it in the cache (or in
        TPUFORGE_PROMETHEUS_ADAPTER), or None when it is not built."""
        env = os.environ.get("TPUFORGE_PROMETHEUS_ADAPTER")
        if env:
            return Path(env) if Path(env).is_file() else None
        v = control_plane_versions()
        name = f"prometheus-adapter-{v['PROMETHEUS_ADAPTER_VERSION']}-build-{v['PROMETHEUS_ADAPTER_BUILD']}"
        path = cache_dir() / name / "prometheus-adapter"
        return path if path.is_file() else None

    def path(self, name: str) -> str:
        return str(self.dir / name)

    @property
    def etcd(self) -> str:
        return self.path("etcd")

    @property
    def kube_apiserver(self) -> str:
        return self.path("kube-apiserver")

    @property
    def kube_controller_manager(self) -> str:
        return self.path("kube-controller-manager")

    @property
    def kubectl(self) -> str:
        return self.path("kubectl")

    def manifests(self, addon: str) -> Path:
        """crd.yaml, webhook.yaml and LICENSE of `jobset` or `kueue`, as the build renders them."""
        return self.dir / "manifests" / addon


@dataclass
class SandboxConfig:
    """Everything a running sandbox's parts need to find each other; saved as sandbox.json."""

    dir: str
    ports: Ports = field(default_factory=Ports)
    pools: list[NodePool] = field(default_factory=lambda: parse_node_pools(DEFAULT_NODES))
    bucket: str = DEFAULT_BUCKET
    # Set when the sandbox uses a fake-gcs-server it did not start (the test session's).
    external_gcs_url: str | None = None

    @property
    def root(self) -> Path:
        return Path(self.dir)

    # The state directory's layout.
    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def run_dir(self) -> Path:  # pidfiles
        return self.root / "run"

    @property
    def logs_dir(self) -> Path:  # one log per component
        return self.root / "logs"

    @property
    def pods_dir(self) -> Path:  # <ns>/<pod>/: volumes, container logs, termination messages
        return self.root / "pods"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def gcs_url(self) -> str:
        return self.external_gcs_url or f"http://127.0.0.1:{self.ports.gcs}"

    def save(self) -> None:
        data = {
            "dir": self.dir,
            "ports": asdict(self.ports),
            "nodes": format_node_pools(self.pools),
            "bucket": self.bucket,
            "external_gcs_url": self.external_gcs_url,
        }
        path = self.root / "sandbox.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, root: Path) -> SandboxConfig:
        data = json.loads((root / "sandbox.json").read_text())
        return cls(
            dir=data["dir"],
            ports=Ports(**{**asdict(Ports.from_env()), **data["ports"]}),
            pools=parse_node_pools(data["nodes"]),
            bucket=data["bucket"],
            external_gcs_url=data.get("external_gcs_url"),
        )
