"""The preflight's arithmetic: per-layer extrapolation, time and cost at an MFU, and the fixes offered."""

from __future__ import annotations

import dataclasses

import pytest

from tpuforge.api.catalog import TPU_SLICES
from tpuforge_workloads.preflight import estimate as est
from tpuforge_workloads.preflight.step import GIB, CompiledStep, out_of_hbm_bytes


def step(layers: int, args: float, temp: float, flops: float, code: float = 0.0) -> CompiledStep:
    return CompiledStep(
        layers=layers,
        argument_bytes=int(args * GIB),
        output_bytes=int(0.5 * GIB),
        alias_bytes=int(0.25 * GIB),
        temp_bytes=int(temp * GIB),
        code_bytes=int(code * GIB),
        flops=flops,
        compile_seconds=1.0,
        platform="tpu",
        attention="splash",
    )


def test_extrapolation_adds_each_layer_kind_s_marginal_cost() -> None:
    # [S] = 10 GiB args; a second sliding layer adds 1 GiB, a global one 2 GiB (and so for temps, flops).
    probes = [step(1, 10, 4, 100.0), step(2, 11, 4.5, 110.0), step(2, 12, 5.0, 130.0)]
    layer_types = ("sliding_attention",) * 5 + ("full_attention",)
    whole = est.extrapolate(probes, layer_types * 10)  # 50 sliding, 10 global

    assert whole.argument_bytes / GIB == pytest.approx(10 + 49 * 1 + 10 * 2)
    assert whole.temp_bytes / GIB == pytest.approx(4 + 49 * 0.5 + 10 * 1.0)
    assert whole.flops == pytest.approx(100 + 49 * 10 + 10 * 30)
    # Outputs not written over donated inputs: 0.25 GiB in every probe, so no per-layer growth.
    assert whole.output_bytes / GIB == pytest.approx(0.25)


def test_a_decoder_of_global_layers_only_is_extrapolated_from_one_and_two_layers() -> None:
    # Qwen3-8B: 36 full-attention layers, probed as [G] and [G, G] (preflight.run.UNIFORM_PROBES).
    whole = est.extrapolate([step(1, 10, 4, 100.0), step(2, 12, 5.0, 130.0)], ("full_attention",) * 36)
    assert whole.argument_bytes / GIB == pytest.approx(10 + 35 * 2)
    assert whole.temp_bytes / GIB == pytest.approx(4 + 35 * 1.0)
    assert whole.flops == pytest.approx(100 + 35 * 30)


def test_the_program_is_extrapolated_per_layer_up_to_a_cap() -> None:
    # As XLA's code for the 31B's step on a v5p-8 (GiB): one layer 0.027, two 0.053 and 0.055. Whole
    # compiles held about the per-layer sum at 6 and 12 layers, and far less at 30 (0.08 against 0.79).
    probes = [step(1, 10, 4, 100.0, 0.027), step(2, 11, 4.5, 110.0, 0.053), step(2, 12, 5.0, 130.0, 0.055)]
    layer_types = ("sliding_attention",) * 5 + ("full_attention",)
    six = est.extrapolate(probes, layer_types)
    assert six.code_bytes / GIB == pytest.approx(0.027 + 4 * 0.026 + 0.028)  # the per-layer sum
    for periods in (5, 10):
        whole = est.extrapolate(probes, layer_types * periods)
        assert whole.code_bytes / GIB == pytest.approx(est.CODE_PROBES * 0.055)  # the cap
        assert whole.total_bytes == pytest.approx(
            whole.argument_bytes + whole.temp_bytes + whole.output_bytes + whole.code_bytes
        )


def test_estimate_of_a_v5p_8_run() -> None:
    v5p8 = TPU_SLICES["v5p-8"]
    figures = est.PerChip(argument_bytes=20 * GIB, temp_bytes=10 * GIB, output_bytes=1 * GIB, flops=459e12 * 0.35)
    e = est.estimate(figures, v5p8, tokens_per_micro_batch=4096, accumulation=8, total_steps=1000, mfu=0.35)

    assert e.fits and e.hbm_per_chip_gib == pytest.approx(31.0) and e.hbm_capacity_gib == 95.74
    assert e.step_seconds == pytest.approx(8.0)  # 8 micro-batches of one second each at 35% of 459 TFLOP/s
    assert e.tokens_per_second == pytest.approx(4096)
    assert e.run_seconds == pytest.approx(8000)
    assert e.run_usd == pytest.approx(8000 / 3600 * v5p8.usd_per_hour)
    assert e.headline() == "fits: 31.0 of 95.74 GiB per chip; ~4,096 tok/s at 35% MFU"
    # A measured throughput maps back to the MFU by the same FLOP count: the estimate's own throughput is its
    # MFU, half of it half.
    assert est.mfu_of(4096, e.flops_per_token, v5p8) == pytest.approx(0.35)
    assert est.mfu_of(2048, e.flops_per_token, v5p8) == pytest.approx(0.175)


def test_a_job_that_does_not_fit_is_told_what_to_change() -> None:
    v6e8 = TPU_SLICES["v6e-8"]
    figures = est.PerChip(argument_bytes=30 * GIB, temp_bytes=10 * GIB, output_bytes=0, flops=1e12)
    e = est.estimate(figures, v6e8, 8192, 1, 10)

    assert not e.fits
    assert e.headline().startswith("does not fit: 40.0 of 31.25 GiB per chip")
    fixes = est.fixes(e, micro_batch_size=2, max_seq_len=8192, remat=False, rank=64)
    assert fixes[0].startswith("turn on spec.training.remat")
    assert any("spec.training.microBatchSize to 1" in f for f in fixes)
    assert any("spec.training.maxSeqLen (now 8192)" in f for f in fixes)
    assert any("spec.lora.rank (now 64)" in f for f in fixes)
    assert fixes[-1].startswith("use a larger slice (spec.tpu.slice)")


def test_qlora_is_offered_where_the_base_is_not_quantized() -> None:
    """The base is quantized as it is loaded, so int8 shrinks the model build as well as the step: it is offered
    whichever of the two does not fit, and not to a job that quantizes its base already."""
    v6e8 = TPU_SLICES["v6e-8"]
    figures = est.PerChip(argument_bytes=30 * GIB, temp_bytes=10 * GIB, output_bytes=0, flops=1e12)
    for build in (20, 40):
        over = est.estimate(dataclasses.replace(figures, build_bytes=build * GIB), v6e8, 8192, 1, 10)
        fixes = est.fixes(over, micro_batch_size=1, max_seq_len=1024, remat=True, rank=16)
        assert fixes[-2].startswith("set spec.lora.baseQuantization: int8") and "model build" in fixes[-2]
        already = est.fixes(over, 1, 1024, True, 16, base_quantization="int8")
        assert not any("baseQuantization" in f for f in already)


def test_mfu_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="mfu must be in"):
        est.estimate(est.PerChip(0, 0, 0, 1.0), TPU_SLICES["v5p-8"], 1, 1, 1, mfu=35)


def test_libtpus_refusal_to_compile_for_want_of_hbm_gives_what_the_step_needs() -> None:
    said = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (72.16G) "
        "exceeds available HBM (31.25G)."
    )
    assert out_of_hbm_bytes(said) == int(72.16 * GIB)
    arguments = said.replace("HLO temporaries (72.16G)", "HLO arguments (512.5M)")
    assert out_of_hbm_bytes(arguments) == int(512.5 * 1024**2)
    assert out_of_hbm_bytes("INTERNAL: something else") is None


def test_a_step_libtpu_refused_does_not_fit_and_its_headline_has_no_speed() -> None:
    refused = CompiledStep(2, 0, 0, 0, int(72.16 * GIB), 0, 0.0, 50.0, "tpu", out_of_hbm=True)
    e = est.estimate(est.PerChip.of(refused), TPU_SLICES["v6e-4"], 65536, 8, 10)
    assert not e.fits and e.headline() == "does not fit: 72.2 of 31.25 GiB per chip"


def test_a_build_that_outgrows_the_chip_fails_a_job_whose_step_fits() -> None:
    # The step needs 20 GiB of 31.25; building the model (adapters added to the base) peaks at 40.
    figures = est.PerChip(argument_bytes=15 * GIB, temp_bytes=5 * GIB, output_bytes=0, flops=1e12, build_bytes=40 * GIB)
    e = est.estimate(figures, TPU_SLICES["v6e-8"], 8192, 1, 10)
    assert e.hbm_per_chip_gib == pytest.approx(20.0) and e.build_gib == pytest.approx(40.0)
    assert not e.fits
    assert e.headline().startswith("does not fit: 40.0 of 31.25 GiB per chip (the model build's peak)")
    # The build's figure extrapolates per layer as the step's do.
    probes = [step(1, 10, 4, 100.0), step(2, 11, 4.5, 110.0), step(2, 12, 5.0, 130.0)]
    probes = [dataclasses.replace(p, build_bytes=int(b * GIB)) for p, b in zip(probes, (10, 11, 12), strict=True)]
    whole = est.extrapolate(probes, ("sliding_attention",) * 5 + ("full_attention",))
    assert whole.build_bytes == pytest.approx((10 + 4 * 1 + 2) * GIB)


def test_the_assumed_mfu_is_the_chip_generation_s_and_says_where_it_comes_from() -> None:
    figures = est.PerChip(argument_bytes=GIB, temp_bytes=GIB, output_bytes=0, flops=197e12)
    v5e = est.estimate(figures, TPU_SLICES["v5litepod-4"], 4096, 1, 10)
    assert v5e.mfu == 0.72 and "measured on one TPU v5e chip on 2026-12-06" in v5e.mfu_source
    assert v5e.step_seconds == pytest.approx(1 / 0.72)
    v5p = est.estimate(figures, TPU_SLICES["v5p-8"], 4096, 1, 10)
    assert v5p.mfu == 0.72 and v5p.mfu_source.startswith("assumed")
    given = est.estimate(figures, TPU_SLICES["v5p-8"], 4096, 1, 10, mfu=0.5)
    assert given.mfu == 0.5 and given.mfu_source == "given (--mfu)"


def test_temporaries_are_never_extrapolated_below_the_largest_probe() -> None:
    # One sliding layer at 4096 tokens on a v5e needed 7.8 GiB more temporaries than two: the differences
    # would make 6 layers need less than nothing.
    probes = [step(1, 2.7, 16.1, 1.0), step(2, 3.7, 8.3, 2.0), step(2, 3.7, 8.3, 2.0)]
    whole = est.extrapolate(probes, ("sliding_attention",) * 5 + ("full_attention",))
    assert whole.temp_bytes == int(16.1 * GIB)
    assert whole.argument_bytes == pytest.approx((2.7 + 5 * 1.0) * GIB, rel=1e-6)
    assert whole.flops == pytest.approx(1.0 + 5 * 1.0)
