"""The operator: kopf settings, login with the credentials `tpuforge.kube.client` loaded, the startup and
cleanup of both kinds' controllers, and `main(argv)` for `tpuforge operator`. Importing this module registers
those handlers."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import kopf

from tpuforge import crds, metrics
from tpuforge.api.autopilot import AUTOPILOT, AUTOPILOT_SPOT_GRACE_SECONDS, CLUSTER_PROFILES, STANDARD
from tpuforge.api.constants import GKE_SPOT_GRACE_SECONDS, PROJECT_VERSION
from tpuforge.api.images import ImageDefaults, unique
from tpuforge.controllers.finetune import controller as finetunejob
from tpuforge.controllers.runtime import defaults, leader
from tpuforge.controllers.serving import controller as servingdeployment
from tpuforge.kinds import KINDS
from tpuforge.kube import client as kube_client

__all__ = ["finetunejob", "main", "servingdeployment"]

log = logging.getLogger(__name__)

# The image flags' defaults, for setting them in the operator's environment instead.
ENV_IMAGE_REGISTRY = "TPUFORGE_IMAGE_REGISTRY"
ENV_IMAGE_TAG = "TPUFORGE_IMAGE_TAG"
ENV_IMAGE_PULL_SECRETS = "TPUFORGE_IMAGE_PULL_SECRETS"  # comma-separated
ENV_CLUSTER_PROFILE = "TPUFORGE_CLUSTER_PROFILE"
# The StorageClass of the volumes a spec names none for; the chart sets it to its Hyperdisk Balanced class (TPU
# v6e VMs attach Hyperdisk only). Unset: the cluster's default class.
ENV_STORAGE_CLASS = "TPUFORGE_STORAGE_CLASS"
# The exit status when the leader could not renew its Lease in time: the Deployment starts it again, as a
# candidate.
EXIT_LEADERSHIP_LOST = 4


@kopf.on.startup()
def configure_operator(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf runs the process and handles no resource (the controllers' informers watch the kinds): it follows no
    # CRD and no namespace, so it needs no RBAC to list or watch them.
    settings.scanning.disabled = True


@kopf.on.startup()
async def start_finetunejob_controller(memo: kopf.Memo, **_: Any) -> None:
    # Startup handlers finish before kopf would watch anything; each returns once its kind's objects and
    # children are in memory (the children first), so the first decisions see the whole cluster.
    memo.finetunejobs = finetunejob.FineTuneJobController(getattr(memo, "namespaces", None))
    await memo.finetunejobs.harness.start()


@kopf.on.startup()
async def start_servingdeployment_controller(memo: kopf.Memo, **_: Any) -> None:
    # Registered after the FineTuneJob controller's: when that one runs, its informer of FineTuneJobs serves
    # both controllers (one watch of the kind for the operator).
    finetunejobs = getattr(memo, "finetunejobs", None)
    memo.servingdeployments = servingdeployment.ServingDeploymentController(
        finetunejobs.finetunejobs if finetunejobs else None, getattr(memo, "namespaces", None)
    )
    await memo.servingdeployments.harness.start()
    # What exists now (modules, kopf, the schemas, the objects just listed) mostly lives as long as the
    # process: keep it out of the collector's full passes, which otherwise walk it again and again.
    gc.freeze()


@kopf.on.cleanup()
async def stop_controllers(memo: kopf.Memo, **_: Any) -> None:
    for name in ("servingdeployments", "finetunejobs"):
        controller = getattr(memo, name, None)
        if controller is not None:
            await controller.harness.close()


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """The credentials `kube_client.configure()` loaded (so kopf and the controllers' client are the same user)."""
    cfg = kube_client.configuration()
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization") or ""
    scheme, _sep, token = header.partition(" ") if " " in header else ("", "", header)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        username=cfg.username or None,
        password=cfg.password or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpuforge operator", description="Run the tpuforge operator.")
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig file; default: the pod's service account in a cluster, else $KUBECONFIG or ~/.kube/config",
    )
    p.add_argument("--context", help="kubeconfig context (default: its current context)")
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    p.add_argument("--metrics-address", default="0.0.0.0", help="address of /metrics (default 0.0.0.0)")
    p.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics; 0 turns it off (default 8080)")
    p.add_argument(
        "--liveness", metavar="URL", help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz (default: none)"
    )
    p.add_argument(
        "--tpu-run-as-root",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run TPU containers as root (still unprivileged, no capabilities) where a spec leaves "
        "spec.tpu.runAsRoot unset (default: on; GKE's TPU device files are root's unless the node hands them to "
        "the pod's user); --no-tpu-run-as-root runs them as uid 65532",
    )
    p.add_argument(
        "--spot-grace-seconds",
        type=int,
        default=GKE_SPOT_GRACE_SECONDS,
        choices=range(1, 121),
        metavar="1..120",
        help="terminationGracePeriodSeconds of Spot TPU pods whose spec leaves spec.tpu.spotGraceSeconds unset: "
        f"what the Spot node pools give on a reclaim (default {GKE_SPOT_GRACE_SECONDS}, GKE's)",
    )
    p.add_argument(
        "--image-registry",
        default=os.environ.get(ENV_IMAGE_REGISTRY, ""),
        metavar="REGISTRY",
        help="registry and path the default images come from, e.g. europe-docker.pkg.dev/PROJECT/tpuforge: "
        "REGISTRY/trainer:TAG, merger, evaluator, serving (default: $TPUFORGE_IMAGE_REGISTRY, else the public "
        "names tpuforge/NAME:TAG and vllm/vllm-tpu)",
    )
    p.add_argument(
        "--image-tag",
        default=os.environ.get(ENV_IMAGE_TAG, PROJECT_VERSION),
        metavar="TAG",
        help=f"tag of the default images (default: $TPUFORGE_IMAGE_TAG, else {PROJECT_VERSION})",
    )
    p.add_argument(
        "--image-pull-secret",
        action="append",
        default=[s.strip() for s in os.environ.get(ENV_IMAGE_PULL_SECRETS, "").split(",") if s.strip()],
        metavar="NAME",
        help="image pull Secret given to every pod the operator creates, before a spec's own; it must exist in "
        "each object's namespace (repeatable; default: $TPUFORGE_IMAGE_PULL_SECRETS, comma-separated)",
    )
    p.add_argument(
        "--cluster-profile",
        choices=CLUSTER_PROFILES,
        default=os.environ.get(ENV_CLUSTER_PROFILE) or STANDARD,
        help="the kind of GKE cluster the pods run on: standard (TPU node pools the platform team creates) or "
        "autopilot (GKE creates the nodes from each pod: every pod states its CPU, memory and ephemeral-storage "
        "requests with equal limits, selects its TPU by accelerator and topology only, and a spec that selects "
        "a node pool is refused); default: $TPUFORGE_CLUSTER_PROFILE, else standard",
    )
    p.add_argument(
        "--storage-class",
        default=os.environ.get(ENV_STORAGE_CLASS, ""),
        metavar="NAME",
        help="StorageClass of the serving volumes and the evaluation's model volume where a spec names none "
        "(default: $TPUFORGE_STORAGE_CLASS, else the cluster's default class)",
    )
    p.add_argument(
        "--local-dataset-paths",
        action="store_true",
        help="accept local paths (file:// or absolute) in spec.dataset and spec.evaluation.datasetUri: only where "
        "pods run as local processes beside the files (the sandbox); on a cluster the pods cannot see them",
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="handle objects only while holding a coordination.k8s.io Lease, so that several replicas can run "
        "and one acts (default: off, for one operator run by hand; the Helm chart turns it on)",
    )
    p.add_argument(
        "--leader-election-namespace",
        default="",
        metavar="NAMESPACE",
        help="namespace of the Lease (default: $POD_NAMESPACE, else the pod's service account's, else default)",
    )
    p.add_argument(
        "--leader-election-name",
        default=leader.DEFAULT_LEASE_NAME,
        metavar="NAME",
        help=f"name of the Lease (default {leader.DEFAULT_LEASE_NAME})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def image_defaults(args: argparse.Namespace) -> ImageDefaults:
    return ImageDefaults(
        registry=args.image_registry.strip().rstrip("/"),
        tag=args.image_tag.strip() or PROJECT_VERSION,
        pull_secrets=tuple(unique(args.image_pull_secret)),
    )


def served_crd_drift() -> list[str]:
    """Each CRD the apiserver serves that is not the one this operator was built with (tpuforge.crds builds
    them from the same models): an old schema would prune the fields a newer operator writes."""
    api = kube_client.api_client()
    path = crds.CRD_PATH
    out = []
    for kind in KINDS:
        query = {"fieldSelector": f"metadata.name={crds.crd_name(kind)}"}  # a list: the operator's permission
        items = kube_client.request(api, "GET", path, query=query).get("items") or []
        drift = crds.schema_drift(kind, items[0] if items else None)
        if drift is not None:
            out.append(drift)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.cluster_profile == AUTOPILOT and args.spot_grace_seconds > AUTOPILOT_SPOT_GRACE_SECONDS:
        p.error(
            f"--spot-grace-seconds {args.spot_grace_seconds}: GKE Autopilot gives a Spot Pod at most "
            f"{AUTOPILOT_SPOT_GRACE_SECONDS} s on preemption; set at most that with --cluster-profile autopilot"
        )
    defaults.configure(
        defaults.OperatorDefaults(
            tpu_run_as_root=args.tpu_run_as_root,
            spot_grace_seconds=args.spot_grace_seconds,
            images=image_defaults(args),
            local_dataset_paths=args.local_dataset_paths,
            cluster_profile=args.cluster_profile,
            storage_class=args.storage_class.strip() or None,
        )
    )
    kopf.configure(verbose=args.verbose)
    try:
        kube_client.configure(args.kubeconfig, args.context)
    except Exception as exc:
        log.error("cannot load Kubernetes credentials: %s", exc)
        return 2
    try:
        drift = served_crd_drift()
    except kube_client.ApiException as exc:
        log.warning("could not read the CRDs to check their schema: %s", exc)
        drift = []
    if drift:
        log.error("%s; %s", "; ".join(drift), crds.DRIFT_FIX)
        return 3
    if args.metrics_port:
        try:
            metrics.serve(args.metrics_address, args.metrics_port)
        except OSError as exc:
            log.error(
                "cannot serve /metrics on %s:%d (--metrics-port): %s", args.metrics_address, args.metrics_port, exc
            )
            return 2
    election = None
    if args.leader_elect:
        election = wait_for_leadership(args)
        if election is None:  # stopped (SIGTERM) while a standby
            return 0
    else:
        metrics.OPERATOR_LEADER.set(1)
    try:
        kopf.run(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            # One operator acts at a time (the leader, or the only one): no kopf peering objects.
            standalone=True,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(namespaces=args.namespace or None),  # for the controllers' own informers
        )
    finally:
        if election is not None:
            election.stop()  # releases the Lease: a standby takes over at its next try
    return 0


def leadership_lost(why: str) -> None:
    """Exit at once, as controller-runtime does: past the renew deadline another replica may take the Lease,
    and two operators must never act together. The Deployment starts this one again, as a candidate."""
    log.error("leader election: lost the Lease (%s); exiting", why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LEADERSHIP_LOST)


def wait_for_leadership(args: argparse.Namespace) -> leader.LeaderElection | None:
    """Start electing and return once this process leads (the election keeps renewing in its thread), or None
    when SIGTERM or SIGINT came first. Meanwhile the liveness URL answers: a standby is alive."""
    namespace = args.leader_election_namespace or leader.default_namespace()
    election = leader.LeaderElection(
        namespace,
        args.leader_election_name,
        leader.default_identity(),
        on_lost=leadership_lost,
        on_change=metrics.OPERATOR_LEADER.set,
    )
    metrics.OPERATOR_LEADER.set(0)
    terminated = threading.Event()
    previous = {s: signal.signal(s, lambda *_: terminated.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    log.info("leader election: %s waits for Lease %s/%s", election.identity, namespace, election.name)
    try:
        with standby_health(args.liveness):
            election.start()
            while not election.wait_leading(0.5) and not terminated.is_set():
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if terminated.is_set():
        election.stop()
        return None
    return election


@contextlib.contextmanager
def standby_health(liveness_url: str | None) -> Iterator[None]:
    """Answer GETs on the liveness URL while waiting for the Lease: kopf serves it only once it runs, and a
    standby that did not answer would be restarted by its liveness probe."""
    if not liveness_url:
        yield
        return
    parts = urlsplit(liveness_url)

    class Standby(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            body = b'{"standby": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a probe every few seconds

    server = ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), Standby)
    thread = threading.Thread(target=server.serve_forever, name="standby-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()  # the port is kopf's next
        thread.join()
