"""The operator's own defaults for spec fields a cluster decides rather than each object: set once from the
command line (the Helm chart's values) when the operator starts, applied to every spec before it is built.

`tpu_run_as_root` (`--tpu-run-as-root` / `--no-tpu-run-as-root`, Helm value `tpu.runAsRoot`, on by default):
run TPU containers as root (unprivileged, no capabilities) when a spec leaves spec.tpu.runAsRoot unset. GKE's
TPU device files keep their host ownership (root) in the container unless the node's containerd is set to
hand them to the pod's user, and GKE's own TPU examples run as root: so root is what works on first use.
`spot_grace_seconds` (`--spot-grace-seconds`, Helm value `tpu.spotGraceSeconds`): the grace Spot TPU pods ask
for when a spec leaves spec.tpu.spotGraceSeconds unset: what the cluster's Spot node pools give (GKE: 15 s).
`images` (`--image-registry`, `--image-tag`, `--image-pull-secret`; Helm values `images.registry`, `images.tag`,
`imagePullSecrets`): the image of every container a spec leaves unset, and the pull Secrets every pod gets
before the spec's own (tpuforge.api.images). Each object keeps the default images it was first given
(`pinned`, recorded in its status.images), so a new operator version changes no running object's images.
`local_dataset_paths` (`--local-dataset-paths`, set by the sandbox, never by the Helm chart): accept local
paths (file:// or absolute) as dataset files, which only pods that run as processes on the operator's machine
can read.
`cluster_profile` (`--cluster-profile`, Helm value `gke.autopilot`): `standard` (the default) renders pods for a
GKE Standard cluster's own node pools; `autopilot` renders every pod the way GKE Autopilot admits it
(tpuforge.manifests.autopilot) and refuses the spec fields that cannot work there (tpuforge.api.autopilot).
`storage_class` (`--storage-class`, else $TPUFORGE_STORAGE_CLASS, which the Helm chart sets from
`storage.className`): the StorageClass of the volumes a spec names none for (the serving claims, the evaluation's
model volume); the chart's is Hyperdisk Balanced, which TPU v6e VMs attach. None: the cluster's default class."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec
from tpuforge.api.autopilot import (
    AUTOPILOT,
    STANDARD,
    ClusterProfile,
    finetune_autopilot_errors,
    serving_autopilot_errors,
)
from tpuforge.api.constants import GKE_SPOT_GRACE_SECONDS
from tpuforge.api.images import PUBLIC_IMAGES, ImageDefaults, ResolvedImages
from tpuforge.api.validation import FieldError
from tpuforge.manifests.autopilot import for_autopilot

S = TypeVar("S", FineTuneJobSpec, ServingDeploymentSpec)


@dataclass(frozen=True)
class OperatorDefaults:
    tpu_run_as_root: bool = True
    spot_grace_seconds: int = GKE_SPOT_GRACE_SECONDS
    images: ImageDefaults = PUBLIC_IMAGES
    local_dataset_paths: bool = False
    cluster_profile: ClusterProfile = STANDARD
    storage_class: str | None = None

    def apply(self, spec: S, images: ResolvedImages | None = None) -> S:
        """`spec` with the fields it leaves unset taken from these defaults; its images from `images` (the
        object's pinned ones) where given."""
        return self._apply_images(self._apply_tpu(spec), self.pinned(type(spec), images))

    def profile_errors(self, spec: FineTuneJobSpec | ServingDeploymentSpec) -> list[FieldError]:
        """The spec's settings that cannot work on the cluster profile (none on Standard)."""
        if self.cluster_profile != AUTOPILOT:
            return []
        if isinstance(spec, FineTuneJobSpec):
            found = finetune_autopilot_errors(spec)
        else:
            found = serving_autopilot_errors(spec)
        return [FieldError(f, m) for f, m in found]

    def workload(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A rendered child as this cluster profile creates it: on Autopilot its pods made Autopilot-valid; on
        Standard the object itself, unchanged."""
        if self.cluster_profile == AUTOPILOT:
            return for_autopilot(dict(obj))
        return obj if isinstance(obj, dict) else dict(obj)

    def pinned(self, kind: type[S], recorded: ResolvedImages | None, refresh: str | None = None) -> ResolvedImages:
        """The default images of an object of `kind`: those it recorded, these defaults' where it recorded none
        (with `refresh`, the annotation value they are resolved at)."""
        d = self.images
        if kind is FineTuneJobSpec:
            current = {"trainer": d.trainer, "merger": d.merger, "evaluator": d.evaluator}
        else:
            current = {"serving": d.serving, "model_fetch": d.model_fetch, "adapters": d.adapters}
        own = recorded or ResolvedImages(refresh=refresh)
        missing = {k: v for k, v in current.items() if not getattr(own, k)}
        return own.model_copy(update=missing) if missing else own

    def _apply_tpu(self, spec: S) -> S:
        unset = {
            field: value
            for field, value in (
                ("run_as_root", self.tpu_run_as_root),
                ("spot_grace_seconds", self.spot_grace_seconds),
            )
            if getattr(spec.tpu, field) is None
        }
        if not unset:
            return spec
        return spec.model_copy(update={"tpu": spec.tpu.model_copy(update=unset)})

    def _apply_images(self, spec: S, d: ResolvedImages) -> S:
        pull_secrets = self.images.with_pull_secrets
        if isinstance(spec, FineTuneJobSpec):
            given = spec.images
            images = given.model_copy(
                update={
                    "trainer": given.trainer or d.trainer,
                    "merger": given.merger or d.merger,
                    "evaluator": given.evaluator or d.evaluator,
                    "pull_secrets": pull_secrets(given.pull_secrets),
                }
            )
            return spec.model_copy(update={"images": images})
        served = spec.images
        return spec.model_copy(
            update={
                "vllm": spec.vllm.model_copy(update={"image": spec.vllm.image or d.serving}),
                "images": served.model_copy(
                    update={
                        "model_fetch": served.model_fetch or d.model_fetch,
                        "adapters": served.adapters or d.adapters,
                        "pull_secrets": pull_secrets(served.pull_secrets),
                    }
                ),
            }
        )


_current = OperatorDefaults()


def configure(defaults: OperatorDefaults) -> None:
    global _current
    _current = defaults


def current() -> OperatorDefaults:
    return _current
