"""The FineTuneJob's preflight: its spec (spec.preflight) and what it found (status.preflight).

Before the first TPU attempt, a CPU Job compiles the job's train step for its slice's TPU topology
(`python -m tpuforge_workloads.preflight`, trainer image) and writes its report as its termination message;
the operator copies the report's figures here.
"""

from __future__ import annotations

from pydantic import Field

from tpuforge.api.base import ApiModel, PodResources, StatusModel
from tpuforge.api.resources import PREFLIGHT_CPU, PREFLIGHT_MEMORY


class PreflightSpec(ApiModel):
    enabled: bool = Field(
        default=True,
        description="Compile the train step for the slice on a CPU node before the first TPU attempt: a job that "
        "does not fit the chips' HBM fails (DoesNotFit) without renting a TPU. false skips it.",
    )
    whole_step: bool = Field(
        default=False,
        description="Compile the run's whole train step instead of one- and two-layer decoders whose figures "
        "are extrapolated to the model (the default; a model of two layers is compiled whole anyway). Slower "
        "and needs far more memory (raise resources: the 31B's 60 layers took over 22 GB of host memory), "
        "but its figures are XLA's own for the run, and the compiled "
        "step is the run's: stored in the compile cache (spec.checkpoint.compileCache), the first TPU attempt "
        "can load it instead of compiling.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node selector for the preflight pod (a CPU node pool)."
    )
    resources: PodResources = Field(
        default_factory=PodResources,
        description=f"CPU and memory the preflight pod requests; unset: {PREFLIGHT_CPU} CPUs and {PREFLIGHT_MEMORY}.",
    )


class PreflightStatus(StatusModel):
    """The preflight's report: libtpu's memory and cost analyses of the step compiled for the slice, and the
    run's time and cost at an assumed MFU (estimates, until a trainer runs)."""

    slice: str | None = None
    topology: str | None = Field(default=None, description="The TPU topology compiled for, e.g. v5p:2x2x1.")
    fits: bool | None = Field(default=None, description="Whether the step fits each chip's HBM.")
    lower_bound: bool | None = Field(
        default=None, description="One layer alone did not fit: the figures are that layer's, a lower bound."
    )
    remat: bool | None = Field(
        default=None,
        description="Whether the step compiled rematerialises its layers: spec.training.remat, or where that is "
        "unset the preflight's choice (off where the step without remat fits, else on), which the training "
        "attempts then use.",
    )
    hbm_per_chip_gib: float | None = Field(
        default=None, alias="hbmPerChipGiB", description="HBM per chip: arguments, outputs and temporaries."
    )
    hbm_capacity_gib: float | None = Field(default=None, alias="hbmCapacityGiB", description="HBM of one chip.")
    build_gib: float | None = Field(
        default=None,
        alias="buildGiB",
        description="HBM per chip at the peak of building the model (LoRA adapters added to the base) before "
        "the first step; fits means both this and hbmPerChipGiB fit.",
    )
    tflops_per_step: float | None = Field(default=None, description="TFLOP per chip per optimizer step.")
    assumed_mfu: float | None = Field(default=None, alias="assumedMFU", description="The MFU the estimates assume.")
    mfu_source: str | None = Field(
        default=None, alias="mfuSource", description="Where assumedMFU comes from (measured on which chip, or assumed)."
    )
    estimated_tokens_per_second: float | None = None
    estimated_seconds: float | None = Field(default=None, description="The whole run's training time.")
    total_steps: int | None = Field(default=None, description="The optimizer steps the estimates are for.")
    estimated_usd: float | None = Field(
        default=None,
        alias="estimatedUSD",
        description="The whole job's estimated cost: the train steps and the model load, compile, checkpoints, "
        "preflight, evaluation and merge around them, at the prices of costPricesAsOf (Spot where spec.tpu.spot).",
    )
    cost_parts: dict[str, float] = Field(
        default_factory=dict,
        alias="costPartsUSD",
        description="estimatedUSD by part: trainSteps, modelLoad, compile, checkpoints, preflight, evaluation, merge.",
    )
    cost_prices_as_of: str | None = Field(
        default=None, description="When the price table the estimate uses was written (tpuforge.api.cost)."
    )
    compile_seconds: float | None = None
    fixes: list[str] = Field(default_factory=list, description="What to change to fit, when it does not.")
    message: str | None = Field(default=None, description="The headline, e.g. fits: 31.2 of 95 GiB per chip; ...")


__all__ = ["PreflightSpec", "PreflightStatus"]
