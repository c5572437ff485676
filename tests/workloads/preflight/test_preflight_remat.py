"""The preflight's remat choice where spec.training.remat is unset: the step without remat where it fits
the slice, else with remat. The compiles are stood in for by given figures (the CPU-compiled tiny model's
choice of remat off is in test_preflight_tpu.py)."""

from __future__ import annotations

from typing import Any

import jax
import pytest

from tpuforge.api import CheckpointSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import TPU_SLICES
from tpuforge_workloads.families.decoder import Decoder
from tpuforge_workloads.preflight import estimate as est
from tpuforge_workloads.preflight import run
from tpuforge_workloads.preflight.step import GIB, CompiledStep

V5E = TPU_SLICES["v5litepod-1"]  # 15.75 GiB


def config(remat: bool | None) -> TrainConfig:
    return TrainConfig(
        model_name="gemma4-tiny",
        model_uri="gs://m/tiny",
        dataset_uri="gs://d/train.jsonl",
        training=TrainingSpec(max_seq_len=2048, remat=remat),
        mesh=MeshSpec(fsdp=1, tp=1),
        checkpoint=CheckpointSpec(uri="gs://r/checkpoints"),
    )


def compiled_with(gib_by_remat: dict[bool, float], compiled: list[bool | None]) -> Any:
    """A stand-in for run.compiled_figures: a whole-model compile that needs gib_by_remat[remat] GiB per chip,
    recording the remat of each compile in `compiled`."""

    def figures(text: Decoder, cfg: TrainConfig, *_: Any) -> tuple[est.PerChip, list[CompiledStep], bool]:
        remat = cfg.training.remat
        compiled.append(remat)
        assert remat is not None
        step = CompiledStep(
            layers=6,
            argument_bytes=int(gib_by_remat[remat] * GIB),
            output_bytes=0,
            alias_bytes=0,
            temp_bytes=0,
            code_bytes=0,
            flops=1e12,
            compile_seconds=1.0,
            platform="tpu",
            attention="splash",
        )
        return est.PerChip.of(step), [step], True

    return figures


def preflight(monkeypatch: pytest.MonkeyPatch, remat: bool | None, gib_by_remat: dict[bool, float]) -> Any:
    compiled: list[bool | None] = []
    monkeypatch.setattr(run, "compiled_figures", compiled_with(gib_by_remat, compiled))
    text: Any = None  # only the stand-in sees it
    return run.preflight(text, config(remat), V5E, 10, devices=jax.devices("cpu")[:1]), compiled


# As measured on one v5e chip: the 31B's first 6 layers at 2048 tokens need 12.23 GiB with remat, 14.28 without.
MEASURED = {True: 12.23, False: 14.28}


def test_unset_remat_is_off_where_the_step_without_it_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    report, compiled = preflight(monkeypatch, None, MEASURED)
    assert compiled == [False]  # one compile: off fits
    j = report.to_json()
    assert j["fits"] is True and j["remat"] is False and j["rematOffGiB"] is None
    assert j["hbmPerChipGiB"] == 14.28 and j["headline"].endswith("at 72% MFU; remat off")
    assert "remat          off" in report.text()


def test_unset_remat_falls_back_to_on_where_the_step_without_it_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    report, compiled = preflight(monkeypatch, None, {True: 12.23, False: 16.5})
    assert compiled == [False, True]
    j = report.to_json()
    assert j["fits"] is True and j["remat"] is True and j["rematOffGiB"] == 16.5
    assert j["hbmPerChipGiB"] == 12.23 and j["fixes"] == []
    assert j["headline"].startswith("fits: 12.2 of 15.75 GiB per chip")
    assert j["headline"].endswith("; remat on (without: 16.5 GiB per chip)")


def test_the_preflight_keeps_remat_off_only_with_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    # 15.3 of 15.75 GiB fits, but with less than REMAT_OFF_HEADROOM to spare: a chosen "off" must not be the
    # attempt that runs out of memory where "on" would have run. The user's own false is kept as it fits.
    report, compiled = preflight(monkeypatch, None, {True: 12.23, False: 15.3})
    assert compiled == [False, True] and report.to_json()["remat"] is True
    assert "more than 95% of a chip's HBM" in report.text()
    report, _ = preflight(monkeypatch, False, {True: 12.23, False: 15.3})
    assert report.to_json()["fits"] is True and report.to_json()["remat"] is False


def test_neither_fits_the_fixes_are_for_remat_on(monkeypatch: pytest.MonkeyPatch) -> None:
    report, compiled = preflight(monkeypatch, None, {True: 20.0, False: 30.0})
    assert compiled == [False, True]
    j = report.to_json()
    assert j["fits"] is False and j["remat"] is True and j["rematOffGiB"] == 30.0
    assert not any("remat" in f for f in j["fixes"])  # it is on already


@pytest.mark.parametrize("written", [True, False])
def test_a_remat_the_user_set_is_compiled_alone_and_kept(monkeypatch: pytest.MonkeyPatch, written: bool) -> None:
    report, compiled = preflight(monkeypatch, written, {True: 12.23, False: 16.5})
    assert compiled == [written]
    j = report.to_json()
    assert j["remat"] is written and j["rematOffGiB"] is None and j["fits"] is written
    assert any("turn on spec.training.remat" in f for f in j["fixes"]) is (not written)
