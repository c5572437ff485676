"""The operator's own defaults for spec fields a cluster decides rather than each object: set once from the
command line (the Helm chart's values) when the operator starts, applied to every spec before it is built.

`tpu_run_as_root` (`--tpu-run-as-root`, Helm value `tpu.runAsRoot`): run TPU containers as root when a spec
leaves spec.tpu.runAsRoot unset, for clusters whose TPU device files only root may open."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec

S = TypeVar("S", FineTuneJobSpec, ServingDeploymentSpec)


@dataclass(frozen=True)
class OperatorDefaults:
    tpu_run_as_root: bool = False

    def apply(self, spec: S) -> S:
        """`spec` with the fields it leaves unset taken from these defaults."""
        if spec.tpu.run_as_root is not None:
            return spec
        tpu = spec.tpu.model_copy(update={"run_as_root": self.tpu_run_as_root})
        return spec.model_copy(update={"tpu": tpu})


_current = OperatorDefaults()


def configure(defaults: OperatorDefaults) -> None:
    global _current
    _current = defaults


def current() -> OperatorDefaults:
    return _current
