"""The operator's own defaults for spec fields a cluster decides rather than each object: set once from the
command line (the Helm chart's values) when the operator starts, applied to every spec before it is built.

`tpu_run_as_root` (`--tpu-run-as-root`, Helm value `tpu.runAsRoot`): run TPU containers as root when a spec
leaves spec.tpu.runAsRoot unset, for clusters whose TPU device files only root may open.
`spot_grace_seconds` (`--spot-grace-seconds`, Helm value `tpu.spotGraceSeconds`): the grace Spot TPU pods ask
for when a spec leaves spec.tpu.spotGraceSeconds unset: what the cluster's Spot node pools give (GKE: 15 s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec
from tpuforge.api.constants import GKE_SPOT_GRACE_SECONDS

S = TypeVar("S", FineTuneJobSpec, ServingDeploymentSpec)


@dataclass(frozen=True)
class OperatorDefaults:
    tpu_run_as_root: bool = False
    spot_grace_seconds: int = GKE_SPOT_GRACE_SECONDS

    def apply(self, spec: S) -> S:
        """`spec` with the fields it leaves unset taken from these defaults."""
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


_current = OperatorDefaults()


def configure(defaults: OperatorDefaults) -> None:
    global _current
    _current = defaults


def current() -> OperatorDefaults:
    return _current
