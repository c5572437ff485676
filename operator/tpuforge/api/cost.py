"""What a FineTuneJob costs, end to end: the train steps the preflight times, and the TPU and CPU time around
them that the steps alone leave out (the base model's load, the XLA compile, the checkpoints the trainer blocks
on, the evaluation Job on its slice, the merge Job on a CPU node), at on-demand or Spot prices.

Every figure is rough and says where it comes from; docs/platform-team.md ("What a job costs") explains the
model. The prices are a dated table (PRICES_AS_OF): list prices move, so the estimate names its table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpuforge.api.catalog import TpuSlice, model_shape, tpu_slice
from tpuforge.api.constants import CPU_SLICE
from tpuforge.api.finetune import FineTuneJobSpec
from tpuforge.api.preflight import PreflightStatus
from tpuforge.api.resources import (
    EVAL_CPU,
    EVAL_CPU_MEMORY,
    GIB,
    MERGE_CPU,
    MERGE_PEAK_BYTES,
    PREFLIGHT_CPU,
    PREFLIGHT_MEMORY,
    quantity,
)

# --- Prices -----------------------------------------------------------------------------------------------
# The table the estimate uses, and when it was written down. On-demand TPU prices per chip-hour are the catalog's
# (tpuforge.api.catalog: v5p $4.20, v6e $2.69, the source report's rates: v5p-8 $16.80/h, v6e-8 $21.52/h).
# Spot prices change often and differ by region; this table does not record them: it assumes SPOT_SHARE of the
# on-demand price, a round figure below the discounts Google advertises for Spot VMs (60-91%). Check both against
# https://cloud.google.com/tpu/pricing and https://cloud.google.com/spot-vms/pricing for your region.
PRICES_AS_OF = "2026-05"
SPOT_SHARE = 0.4
# CPU nodes (the merge, the preflight, a CPU evaluation): Compute Engine N2 on-demand in us-central1, per vCPU-hour
# and per GiB-hour, charged for what the pod requests (the node's share it occupies).
CPU_USD_PER_VCPU_HOUR = 0.031611
CPU_USD_PER_GIB_HOUR = 0.004237

# --- Time model -------------------------------------------------------------------------------------------
# Each host reads its share of the base model from GCS before the first step (tpuforge_workloads.model.checkpoint_read:
# ranged reads, 8 in flight). Assumed rate per host: a TPU VM reaches GCS at several hundred MB/s.
LOAD_BYTES_PER_SECOND_PER_HOST = 400e6
# The first attempt compiles the train step on the TPU host (minutes for the 31B; unmeasured on TPU) unless the
# compile cache already holds it (the preflight with wholeStep stores it there).
TRAIN_COMPILE_SECONDS = 600.0
# The trainer blocks while it saves a checkpoint (LoRA weights and optimizer state, ~1.5 GB for the 31B at rank
# 64) to GCS; about as long as the Spot grace the operator checks it against.
CHECKPOINT_SECONDS = 15.0
# The evaluation on a TPU slice: vLLM loads the model (as above, one host) and compiles (~8-10 min on v6e-8,
# docs notes), then the JAX loss loads it again; generation runs at about the serving throughput the source
# report measured on v6e-8 (~1,200 output tokens/s at batch), for the base and the adapter.
EVAL_COMPILE_SECONDS = 540.0
EVAL_OUTPUT_TOKENS_PER_SECOND = 1200.0
EVAL_LOADS = 2  # vLLM and the JAX loss each read the weights
EVAL_MODELS = 2  # the base and the adapter are both scored
# On a CPU node the tiny model's evaluation takes minutes.
EVAL_CPU_SECONDS = 600.0
# The streamed merge reads the base and writes the merged copy, both through GCS (docs/performance.md).
MERGE_BYTES_PER_SECOND = 150e6
# The preflight compiles a few small decoders on a CPU node: minutes.
PREFLIGHT_SECONDS = 600.0


def tpu_usd_per_hour(slc: TpuSlice, spot: bool) -> float:
    """The slice's price per hour from the table: on-demand, or Spot (SPOT_SHARE of it)."""
    return round(slc.usd_per_hour * (SPOT_SHARE if spot else 1.0), 2)


def cpu_usd_per_hour(cpu: str, memory: str) -> float:
    """A CPU pod's requests at the table's per-vCPU and per-GiB prices."""
    return float(quantity(cpu)) * CPU_USD_PER_VCPU_HOUR + float(quantity(memory)) / GIB * CPU_USD_PER_GIB_HOUR


@dataclass(frozen=True)
class CostPart:
    """One line of the estimate: what runs, for how long, at what price."""

    name: str  # trainSteps, modelLoad, compile, checkpoints, evaluation, merge, preflight
    seconds: float
    usd_per_hour: float

    @property
    def usd(self) -> float:
        return self.seconds / 3600 * self.usd_per_hour


@dataclass(frozen=True)
class RunEstimate:
    parts: tuple[CostPart, ...]
    spot: bool
    prices_as_of: str = PRICES_AS_OF

    @property
    def usd(self) -> float:
        return sum(p.usd for p in self.parts)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts)

    def by_part(self) -> dict[str, float]:
        """USD per part, to the cent, for the status."""
        return {p.name: round(p.usd, 2) for p in self.parts}


def run_estimate(spec: FineTuneJobSpec, train_seconds: float, total_steps: int) -> RunEstimate:
    """The whole job's cost: `train_seconds` of train steps (the preflight's estimate of `total_steps` steps)
    and everything else the job runs, at the table's prices (Spot where spec.tpu.spot)."""
    slc = tpu_slice(spec.tpu.slice)
    model = model_shape(spec.model.name)
    spot = spec.tpu.spot
    train_price = tpu_usd_per_hour(slc, spot)
    load = model.weight_bytes / slc.hosts / LOAD_BYTES_PER_SECOND_PER_HOST
    checkpoints = math.ceil(total_steps / spec.checkpoint.every_steps) if total_steps else 0
    parts = [
        CostPart("trainSteps", train_seconds, train_price),
        CostPart("modelLoad", load, train_price),
        CostPart("compile", TRAIN_COMPILE_SECONDS, train_price),
        CostPart("checkpoints", checkpoints * CHECKPOINT_SECONDS, train_price),
    ]
    if spec.preflight.enabled:
        own = spec.preflight.resources
        parts.append(
            CostPart(
                "preflight",
                PREFLIGHT_SECONDS,
                cpu_usd_per_hour(own.cpu or PREFLIGHT_CPU, own.memory or PREFLIGHT_MEMORY),
            )
        )
    ev = spec.evaluation
    if ev is not None:
        if ev.slice == CPU_SLICE:
            own = ev.resources
            parts.append(
                CostPart(
                    "evaluation", EVAL_CPU_SECONDS, cpu_usd_per_hour(own.cpu or EVAL_CPU, own.memory or EVAL_CPU_MEMORY)
                )
            )
        else:
            eval_slc = tpu_slice(ev.slice)
            tokens = EVAL_MODELS * ev.max_examples * ev.max_new_tokens
            seconds = (
                EVAL_LOADS * model.weight_bytes / LOAD_BYTES_PER_SECOND_PER_HOST
                + EVAL_COMPILE_SECONDS
                + tokens / EVAL_OUTPUT_TOKENS_PER_SECOND
            )
            # The evaluation pod takes no Spot setting: it runs on demand.
            parts.append(CostPart("evaluation", seconds, tpu_usd_per_hour(eval_slc, False)))
    if spec.merge.enabled:
        own = spec.merge.resources
        memory = own.memory or f"{math.ceil(MERGE_PEAK_BYTES / GIB)}Gi"
        merge_seconds = 2 * model.weight_bytes / MERGE_BYTES_PER_SECOND
        parts.append(CostPart("merge", merge_seconds, cpu_usd_per_hour(own.cpu or MERGE_CPU, memory)))
    return RunEstimate(tuple(parts), spot)


def with_run_cost(pf: PreflightStatus, spec: FineTuneJobSpec) -> PreflightStatus:
    """The preflight's report with the whole job's cost in estimatedUSD (its own figure prices the train steps
    only, on demand), by part, and the price table's date. Unchanged when it timed no steps."""
    if pf.estimated_seconds is None or pf.total_steps is None:
        return pf
    est = run_estimate(spec, pf.estimated_seconds, pf.total_steps)
    return pf.model_copy(
        update={"estimated_usd": round(est.usd, 2), "cost_parts": est.by_part(), "cost_prices_as_of": est.prices_as_of}
    )


__all__ = [
    "CPU_USD_PER_GIB_HOUR",
    "CPU_USD_PER_VCPU_HOUR",
    "PRICES_AS_OF",
    "SPOT_SHARE",
    "CostPart",
    "RunEstimate",
    "cpu_usd_per_hour",
    "run_estimate",
    "tpu_usd_per_hour",
    "with_run_cost",
]
