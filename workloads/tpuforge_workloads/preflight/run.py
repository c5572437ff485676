"""One preflight: a job's train step compiled for its slice's TPU topology, and what follows from it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tpuforge.api import TrainConfig, resolved_remat
from tpuforge.api.catalog import TpuSlice
from tpuforge.api.display import hbm_gib
from tpuforge_workloads.data.preference import rows_per_example
from tpuforge_workloads.families.decoder import Decoder
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight import estimate as est
from tpuforge_workloads.preflight.step import GIB, CompiledStep, compile_train_step, with_layers
from tpuforge_workloads.preflight.topology import slice_devices, topology_name

SLIDING, GLOBAL = "sliding_attention", "full_attention"
# The three small decoders whose differences give a sliding and a global layer's cost (estimate.py).
PROBES = ((SLIDING,), (SLIDING, SLIDING), (SLIDING, GLOBAL))
# A decoder whose layers are all alike (Qwen3: every layer global): one layer, then two.
UNIFORM_PROBES = ((GLOBAL,), (GLOBAL, GLOBAL))


def _sig(x: float) -> float:
    """Four significant digits: a tiny model's figures stay visible, the 31B's stay readable."""
    return float(f"{x:.4g}")


@dataclass
class Report:
    """The preflight's result: printed, written as JSON, and copied into the FineTuneJob's status."""

    estimate: est.Estimate
    compiled_layers: list[int]  # the layers of each compile ([60] for a whole-model compile)
    compile_seconds: float
    extrapolated: bool
    fixes: list[str] = field(default_factory=list)
    lower_bound: bool = False  # a partial compile already exceeds a chip: its figures are a lower bound
    topology: str = ""  # what was compiled for, in libtpu's words (v5p:2x2x1)
    attention: str = "masked"  # what the compiled step runs: "splash" (segment ids, attention.py) or "masked"
    remat: bool = True  # whether the compiled step rematerialises its layers
    remat_off: Compiled | None = None  # the step without remat, where it was compiled first and did not fit

    def to_json(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "slice": e.slice_id,
            "topology": self.topology,
            "fits": e.fits,
            "headline": self.headline(),
            "lowerBound": self.lower_bound,
            "hbmPerChipGiB": round(e.hbm_per_chip_gib, 2),
            "argumentsGiB": round(e.argument_gib, 2),
            "temporariesGiB": round(e.temp_gib, 2),
            "buildGiB": round(e.build_gib, 2),
            "hbmCapacityGiB": e.hbm_capacity_gib,
            "tflopsPerStep": _sig(e.tflops_per_step),
            "flopsPerToken": round(e.flops_per_token),
            "tokensPerStep": e.tokens_per_step,
            "assumedMFU": e.mfu,
            "mfuSource": e.mfu_source,
            "stepSeconds": _sig(e.step_seconds),
            "estimatedTokensPerSecond": round(e.tokens_per_second),
            "totalSteps": e.total_steps,
            "estimatedSeconds": _sig(e.run_seconds),
            "estimatedUSD": _sig(e.run_usd),
            "compileSeconds": round(self.compile_seconds, 1),
            "compiledLayers": self.compiled_layers,
            "extrapolated": self.extrapolated,
            "attention": self.attention,
            "remat": self.remat,
            "rematOffGiB": None if self.remat_off is None else round(self.remat_off.estimate.attempt_gib, 2),
            "fixes": self.fixes,
        }

    def headline(self) -> str:
        h = self.estimate.headline()
        h = h.replace(": ", ": at least ", 1) if self.lower_bound else h
        if self.remat_off is not None:
            h += f"; remat on (without: {self.remat_off.needs()} GiB per chip)"
        elif not self.remat:  # the faster step: said, as the trainer will run it
            h += "; remat off"
        return h

    def remat_line(self) -> str:
        if self.remat_off is None:
            return "on" if self.remat else "off"
        spare = f"{1 - REMAT_OFF_HEADROOM:.0%}"
        return f"on (off needs {self.remat_off.needs()} GiB per chip: more than {spare} of a chip's HBM)"

    def text(self) -> str:
        e = self.estimate
        how = (
            f"a lower bound: {self.compiled_layers[-1]} layer(s) alone exceed a chip"
            if self.lower_bound
            else f"extrapolated from compiles of {self.compiled_layers} layers"
            if self.extrapolated
            else f"whole model ({self.compiled_layers[0]} layers) compiled"
        )
        lines = [
            f"preflight for {e.slice_id}: {self.headline()}",
            f"  HBM per chip   {e.hbm_per_chip_gib:8.2f} GiB (arguments {e.argument_gib:.2f}, temporaries "
            f"{e.temp_gib:.2f}) of {hbm_gib(e.hbm_capacity_gib)} GiB",
            f"  model build    {e.build_gib:8.2f} GiB per chip (adapters added to the base, before the first step)",
            f"  compute        {e.tflops_per_step:8.2f} TFLOP per chip per step, {e.flops_per_token / 1e9:.1f} "
            f"GFLOP per token per chip ({e.tokens_per_step:,} tokens per step)",
            f"  at {e.mfu:.0%} MFU     {e.step_seconds:8.2f} s per step, ~{e.tokens_per_second:,.0f} tokens/s",
            f"  that MFU       {e.mfu_source}",
            f"  whole run      {e.total_steps:,} steps, ~{e.run_seconds / 3600:.1f} h, "
            f"~${e.run_usd:,.0f} at list price",
            f"  compile        {self.compile_seconds:.0f} s ({how})",
            f"  attention      {self.attention}",
            f"  remat          {self.remat_line()}",
        ]
        if self.fixes:
            lines.append("  to fit: " + "; or ".join(self.fixes))
        return "\n".join(lines)


def compiled_figures(
    text: Decoder, config: TrainConfig, mesh: Any, total_steps: int, whole: bool, capacity_bytes: float
) -> tuple[est.PerChip, list[CompiledStep], bool]:
    """The whole decoder's per-chip figures: one whole-model compile, or the three probes extrapolated.
    A model of no more layers than a probe is compiled whole: one compile instead of three.
    The third value is False when the first probe alone (one layer: a lower bound of the whole model)
    already needs more than `capacity_bytes`, or libtpu refused a compile for want of HBM; the figures
    are then that compile's, and nothing more is compiled."""
    probes = PROBES if SLIDING in text.layer_types else UNIFORM_PROBES
    if whole or len(text.layer_types) <= max(len(p) for p in probes):
        c = compile_train_step(text, config, mesh, total_steps)
        return est.PerChip.of(c), [c], not c.out_of_hbm
    steps: list[CompiledStep] = []
    for probe in probes:
        steps.append(compile_train_step(with_layers(text, probe), config, mesh, total_steps))
        first = steps[0]
        if steps[-1].out_of_hbm or (len(steps) == 1 and max(first.hbm_bytes, first.build_bytes) > capacity_bytes):
            return est.PerChip.of(steps[-1]), steps, False
    return est.extrapolate(steps, text.layer_types), steps, True


def remat_choices(remat: bool | None) -> tuple[bool, ...]:
    """The remat settings to compile, in order, until one fits: the config's own, or where it is unset
    (the preflight chooses) off, the faster, then on."""
    return (remat,) if remat is not None else (False, True)


def with_remat(config: TrainConfig, remat: bool) -> TrainConfig:
    return config.model_copy(update={"training": config.training.model_copy(update={"remat": remat})})


@dataclass
class Compiled:
    """One remat setting's compiles and what they say of the whole run."""

    remat: bool
    estimate: est.Estimate
    steps: list[CompiledStep]
    complete: bool

    def needs(self) -> str:
        """HBM per chip at the attempt's peak, as said: "at least" where the compiles stopped early."""
        gib = f"{self.estimate.attempt_gib:,.1f}"
        return gib if self.complete else f"at least {gib}"


# Where the preflight chooses, remat off must fit with this share of each chip's HBM to spare: the
# extrapolated figures were within 4% of the chip's own compile either way (docs/performance.md, "The
# preflight against the chip"), and a wrong "off" costs an attempt out of memory where "on" would have run.
REMAT_OFF_HEADROOM = 0.05


def chosen_fits(c: Compiled, choosing: bool) -> bool:
    """Whether the preflight keeps `c`: it fits, and where the preflight chose remat off, with the headroom."""
    e = c.estimate
    if choosing and not c.remat:
        return e.attempt_gib <= e.hbm_capacity_gib * (1 - REMAT_OFF_HEADROOM)
    return e.fits


def compile_and_estimate(
    text: Decoder, config: TrainConfig, slc: TpuSlice, mesh: Any, total_steps: int, mfu: float | None, whole: bool
) -> Compiled:
    """`config`'s step (its remat set) compiled for `mesh`, and the run's estimate on `slc`."""
    t = config.training
    steps_for_schedule = max(total_steps, t.warmup_steps + 1)
    figures, steps, complete = compiled_figures(
        text, config, mesh, steps_for_schedule, whole, slc.hbm_gib_per_chip * GIB
    )
    rows = t.micro_batch_size * config.mesh.fsdp * rows_per_example(config.method, config.grpo)
    e = est.estimate(figures, slc, rows * t.max_seq_len, t.gradient_accumulation_steps, total_steps, mfu)
    return Compiled(resolved_remat(t, None), e, steps, complete)


def preflight(
    text: Decoder,
    config: TrainConfig,
    slc: TpuSlice,
    total_steps: int,
    mfu: float | None = None,
    whole: bool = False,
    devices: list[Any] | None = None,
) -> Report:
    """Compile `config`'s train step for `slc` (its real TPU topology unless `devices` are given) and
    estimate HBM, speed and cost (at `mfu` of the chips' peak; None: the chip generation's, est.utilization).
    With training.remat unset, the step is compiled without remat first and reported so where that fits
    (remat_choices); else with remat."""
    started = time.monotonic()
    mesh = make_mesh(config.mesh.fsdp, config.mesh.tp, devices if devices is not None else slice_devices(slc))
    tried: list[Compiled] = []
    choices = remat_choices(config.training.remat)
    for remat in choices:
        tried.append(compile_and_estimate(text, with_remat(config, remat), slc, mesh, total_steps, mfu, whole))
        if chosen_fits(tried[-1], len(choices) > 1):
            break
    chosen = tried[-1]
    e, t = chosen.estimate, config.training
    fixes = (
        []
        if e.fits
        else est.fixes(
            e, t.micro_batch_size, t.max_seq_len, chosen.remat, config.lora.rank, config.lora.base_quantization
        )
    )
    return Report(
        e,
        [s.layers for s in chosen.steps],
        time.monotonic() - started,
        len(chosen.steps) > 1,
        fixes,
        lower_bound=not chosen.complete,
        topology=topology_name(slc) if devices is None else f"{len(devices)} {devices[0].platform} devices",
        attention=chosen.steps[0].attention,
        remat=chosen.remat,
        remat_off=tried[0] if len(tried) > 1 else None,
    )
