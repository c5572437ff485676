"""The operator: kopf settings, login with the credentials `tpuforge.kube.client` loaded, and `main(argv)` for
`tpuforge operator`. Importing this package registers every kind's handlers (one module per kind)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any

import kopf

from tpuforge import crds, metrics
from tpuforge.api.autopilot import AUTOPILOT, AUTOPILOT_SPOT_GRACE_SECONDS, CLUSTER_PROFILES, STANDARD
from tpuforge.api.constants import GKE_SPOT_GRACE_SECONDS, PROJECT_VERSION
from tpuforge.api.images import ImageDefaults, unique
from tpuforge.controllers.finetune import controller as finetunejob
from tpuforge.controllers.runtime import defaults
from tpuforge.controllers.serving import controller as servingdeployment
from tpuforge.kinds import KINDS
from tpuforge.kube import client as kube_client
from tpuforge.kube import events as kube_events

__all__ = ["finetunejob", "main", "servingdeployment"]

log = logging.getLogger(__name__)

PREFIX = "tpuforge.dev"
# The image flags' defaults, for setting them in the operator's environment instead.
ENV_IMAGE_REGISTRY = "TPUFORGE_IMAGE_REGISTRY"
ENV_IMAGE_TAG = "TPUFORGE_IMAGE_TAG"
ENV_IMAGE_PULL_SECRETS = "TPUFORGE_IMAGE_PULL_SECRETS"  # comma-separated
ENV_CLUSTER_PROFILE = "TPUFORGE_CLUSTER_PROFILE"


@kopf.on.startup()
def configure_operator(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Handler state (used by kinds with change handlers) lives in our own annotations and finalizer.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.posting.reporting_component = kube_events.COMPONENT


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
        "--local-dataset-paths",
        action="store_true",
        help="accept local paths (file:// or absolute) in spec.dataset and spec.evaluation.datasetUri: only where "
        "pods run as local processes beside the files (the sandbox); on a cluster the pods cannot see them",
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
        )
    )
    kopf.configure(verbose=args.verbose)
    if not args.verbose:
        # kopf logs every handled watch event at INFO: thousands a minute on a busy cluster.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
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
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=True,  # one operator per cluster (the Helm chart runs one replica); no peering objects
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(namespaces=args.namespace or None),  # for the controllers' own informers
    )
    return 0
