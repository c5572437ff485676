"""From compiled steps to the preflight's answers: HBM per chip of the whole model, time and cost of the run.

Compiling all 60 layers of the 31B takes long on a small CPU host, and XLA's per-chip figures grow with the
layers in a known way: parameters, optimizer state and remat's saved activations per layer, plus the peak
of one layer's recomputation and the logits, which do not grow. So the preflight compiles three small
decoders, [sliding], [sliding, sliding] and [sliding, global], and takes the marginal cost of a sliding
and of a global layer from their differences:

    whole = one_sliding + (sliding_layers - 1) x (two_sliding - one_sliding) + global_layers x (mixed - one_sliding)

(each difference at least zero, and the temporaries at least the largest probe's: they are a peak, and a
probe's peak can exceed a longer probe's).

So for the arguments, the temporaries, the outputs not written over donated inputs, and the FLOPs. The
program's code grows so only up to a point: XLA's code for the 31B's step (v5p-8, per chip) was 29 MB for
one layer, 173 MB for 6 and 347 MB for 12, each within 2% of the per-layer sum, but 90 MB for 30 layers,
where XLA shares it between identical layers, against 846 MB by the sum. So the code is the per-layer sum
up to CODE_PROBES times the largest probe's code (12 layers came to 5.9 times).

The benchmark (benchmarks/preflight_31b.py) compares this with a compile of more layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpuforge.api.catalog import TpuSlice
from tpuforge.api.display import hbm_gib
from tpuforge_workloads.preflight.step import GIB, CompiledStep

# The share of a chip's peak bf16 FLOP/s the trainer's step reaches, by XLA's FLOP count of the step (remat's
# recomputation included: the count the estimate divides), per chip generation (GKE accelerator label), and
# where each figure comes from. Only TPU v5e has been measured; the others assume its figure until they are.
# (Before that, the default was 8%, the report's own v5p-8 run: an unoptimised setup, not this trainer.)
V5E = 0.72
V5E_MEASURED = (
    "measured on one TPU v5e chip on 2026-12-06 (JAX 0.10.2, libtpu 0.0.42.1): the trainer's step on the 31B's "
    "first 6 layers at 2048-3072 tokens, micro-batch 1-2, remat on and off, ran at 72-83% of 197 TFLOP/s by "
    "XLA's count; the low end"
)
_ASSUMED = f"assumed equal to TPU v5e's measured {V5E:.0%}"
UTILIZATION: dict[str, tuple[float, str]] = {
    "tpu-v5-lite-podslice": (V5E, V5E_MEASURED),
    "tpu-v5p-slice": (V5E, f"{_ASSUMED} (not measured on v5p; one chip, no collectives)"),
    "tpu-v6e-slice": (V5E, f"{_ASSUMED} (not measured on v6e; one chip, no collectives)"),
}


def utilization(slc: TpuSlice) -> tuple[float, str]:
    """The share of peak assumed for `slc`'s chips, and where it comes from."""
    return UTILIZATION.get(slc.accelerator, (V5E, f"{_ASSUMED} ({slc.accelerator})"))


# The most the whole model's program is taken to be, in multiples of the largest probe's (module docstring).
CODE_PROBES = 6


@dataclass(frozen=True)
class PerChip:
    """XLA's per-chip figures of one compiled step (or their extrapolation to the whole model)."""

    argument_bytes: float
    temp_bytes: float
    output_bytes: float  # outputs not written over donated inputs
    flops: float
    code_bytes: float = 0.0  # the program
    build_bytes: float = 0.0  # the peak of the model build (adapters added to the base), before the first step

    @classmethod
    def of(cls, c: CompiledStep) -> PerChip:
        return cls(c.argument_bytes, c.temp_bytes, c.output_bytes - c.alias_bytes, c.flops, c.code_bytes, c.build_bytes)

    @property
    def total_bytes(self) -> float:
        return self.argument_bytes + self.temp_bytes + self.output_bytes + self.code_bytes

    def plus(self, other: PerChip, times: float = 1.0) -> PerChip:
        return PerChip(
            self.argument_bytes + times * other.argument_bytes,
            self.temp_bytes + times * other.temp_bytes,
            self.output_bytes + times * other.output_bytes,
            self.flops + times * other.flops,
            self.code_bytes + times * other.code_bytes,
            self.build_bytes + times * other.build_bytes,
        )

    def minus(self, other: PerChip) -> PerChip:
        return self.plus(other, -1.0)

    def at_least_zero(self) -> PerChip:
        """Each figure, or 0 where it is negative (a layer's marginal cost is never taken as a saving)."""
        return PerChip(*(max(0.0, getattr(self, f.name)) for f in dataclasses.fields(self)))


def extrapolate(probes: list[CompiledStep], layer_types: tuple[str, ...]) -> PerChip:
    """The whole decoder's per-chip figures from the small compiles: [sliding], [sliding, sliding] and
    [sliding, global] (see the module docstring), or for a decoder of global layers only [global] and
    [global, global]."""
    if len(probes) == 2:
        base, two = (PerChip.of(p) for p in probes)
        whole = base.plus(two.minus(base).at_least_zero(), len(layer_types) - 1)
    else:
        base, two_sliding, mixed = (PerChip.of(p) for p in probes)
        per_sliding = two_sliding.minus(base).at_least_zero()
        per_global = mixed.minus(base).at_least_zero()
        sliding = sum(1 for t in layer_types if t == "sliding_attention")
        whole = base.plus(per_sliding, max(0, sliding - 1)).plus(per_global, len(layer_types) - sliding)
    # Temporaries are the program's peak, not a sum: a probe can need more than a longer one (one sliding layer
    # at 4096 tokens on a v5e needed 7.8 GiB more than two), so no layer's marginal temporaries are negative
    # and the whole needs at least what its largest probe did.
    temp = max(whole.temp_bytes, max(p.temp_bytes for p in probes))
    code = min(whole.code_bytes, CODE_PROBES * max(p.code_bytes for p in probes))
    return dataclasses.replace(whole, temp_bytes=temp, code_bytes=code)


@dataclass(frozen=True)
class Estimate:
    """The preflight's answer for one job on one slice."""

    slice_id: str
    hbm_per_chip_gib: float  # the train step's peak
    argument_gib: float
    temp_gib: float
    hbm_capacity_gib: float
    tflops_per_step: float  # per chip, one optimizer step (all micro-batches)
    tokens_per_step: int
    mfu: float
    step_seconds: float
    tokens_per_second: float
    total_steps: int
    run_seconds: float
    run_usd: float
    build_gib: float = 0.0  # the model build's peak (adapters added to the base), before the first step
    mfu_source: str = ""  # where the assumed utilization comes from (utilization.py)

    @property
    def attempt_gib(self) -> float:
        """What the attempt needs per chip at its peak: the build's or the step's, whichever is more."""
        return max(self.hbm_per_chip_gib, self.build_gib)

    @property
    def fits(self) -> bool:
        return self.attempt_gib <= self.hbm_capacity_gib

    @property
    def flops_per_token(self) -> float:
        """One chip's FLOPs per token of the whole slice's step (times the chips: the slice's)."""
        return self.tflops_per_step * 1e12 / self.tokens_per_step if self.tokens_per_step else 0.0

    def headline(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        said = f"{verdict}: {self.attempt_gib:,.1f} of {hbm_gib(self.hbm_capacity_gib)} GiB per chip"
        if self.build_gib > self.hbm_per_chip_gib:
            said += " (the model build's peak)"
        if not self.tokens_per_second:  # no FLOP count (libtpu refused the compile)
            return said
        return f"{said}; ~{self.tokens_per_second:,.0f} tok/s at {self.mfu:.0%} MFU"


def estimate(
    figures: PerChip,
    slc: TpuSlice,
    tokens_per_micro_batch: int,
    accumulation: int,
    total_steps: int,
    mfu: float | None = None,
) -> Estimate:
    """Time and cost of `total_steps` optimizer steps of `accumulation` micro-batches, at `mfu` of the
    chips' peak (by XLA's FLOP count of the step, remat's recomputation included); None: the chip
    generation's (`utilization`)."""
    source = "given (--mfu)"
    if mfu is None:
        mfu, source = utilization(slc)
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    flops_per_step = figures.flops * accumulation
    step_seconds = flops_per_step / (slc.peak_tflops_per_chip * 1e12 * mfu)
    tokens_per_step = tokens_per_micro_batch * accumulation
    run_seconds = step_seconds * total_steps
    return Estimate(
        slice_id=slc.id,
        hbm_per_chip_gib=figures.total_bytes / GIB,
        argument_gib=figures.argument_bytes / GIB,
        temp_gib=figures.temp_bytes / GIB,
        hbm_capacity_gib=slc.hbm_gib_per_chip,
        tflops_per_step=flops_per_step / 1e12,
        tokens_per_step=tokens_per_step,
        mfu=mfu,
        step_seconds=step_seconds,
        tokens_per_second=tokens_per_step / step_seconds if step_seconds else 0.0,
        total_steps=total_steps,
        run_seconds=run_seconds,
        run_usd=run_seconds / 3600 * slc.usd_per_hour,
        build_gib=figures.build_bytes / GIB,
        mfu_source=source,
    )


def mfu_of(tokens_per_second: float, flops_per_token: float, slc: TpuSlice) -> float:
    """The MFU a measured throughput (tokens/s of the whole slice) corresponds to, by the same FLOP count:
    `flops_per_token` is one chip's FLOPs per token of the slice's batch (`Estimate.flops_per_token`), and
    every chip runs its share at once, so the chips' peak does not add up here."""
    return tokens_per_second * flops_per_token / (slc.peak_tflops_per_chip * 1e12)


def fixes(
    e: Estimate, micro_batch_size: int, max_seq_len: int, remat: bool, rank: int, base_quantization: str = "none"
) -> list[str]:
    """What would make a job that does not fit fit, most effective first."""
    out: list[str] = []
    if not remat:
        out.append("turn on spec.training.remat (recompute activations in the backward pass)")
    if micro_batch_size > 1:
        out.append(
            f"lower spec.training.microBatchSize to {max(1, micro_batch_size // 2)} and raise "
            "gradientAccumulationSteps to keep the tokens per step"
        )
    if max_seq_len > 1024:
        out.append(f"lower spec.training.maxSeqLen (now {max_seq_len})")
    if rank > 16:
        out.append(f"lower spec.lora.rank (now {rank})")
    if base_quantization == "none":
        # The base's targeted weights are quantized as they are loaded: the model build and the step both
        # shrink (docs/training.md, QLoRA).
        out.append(
            "set spec.lora.baseQuantization: int8 (QLoRA: the base's adapted weights held in int8, quantized as "
            "they are loaded, in the model build as in the step)"
        )
    out.append("use a larger slice (spec.tpu.slice): FSDP spreads the weights over more chips")
    return out
