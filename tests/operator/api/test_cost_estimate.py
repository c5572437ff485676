"""The whole job's cost estimate (tpuforge.api.cost): the train steps the preflight times plus the model load,
compile, checkpoints, preflight, evaluation and merge, at the dated price table, Spot where the job is."""

from __future__ import annotations

import pytest

from tests.fixtures.finetune.specs import spec
from tpuforge.api import cost
from tpuforge.api.catalog import TPU_SLICES, model_shape
from tpuforge.api.preflight import PreflightStatus

HOURS = 3.34 * 3600  # the source report's run on a v5p-8


def test_every_part_is_priced_and_the_total_is_their_sum() -> None:
    s = spec(merge={"writeAdapter": True}, evaluation={"datasetUri": "gs://b/data/eval.jsonl"})
    e = cost.run_estimate(s, HOURS, total_steps=1000)
    parts = e.by_part()
    assert list(parts) == ["trainSteps", "modelLoad", "compile", "checkpoints", "preflight", "evaluation", "merge"]
    v5p8 = TPU_SLICES["v5p-8"]
    assert parts["trainSteps"] == pytest.approx(3.34 * v5p8.usd_per_hour, abs=0.01)  # $56.11 in the report
    assert parts["checkpoints"] == pytest.approx(10 * cost.CHECKPOINT_SECONDS / 3600 * v5p8.usd_per_hour, abs=0.01)
    load = model_shape("gemma4-31b").weight_bytes / cost.LOAD_BYTES_PER_SECOND_PER_HOST
    assert parts["modelLoad"] == pytest.approx(load / 3600 * v5p8.usd_per_hour, abs=0.01)
    assert e.usd == pytest.approx(sum(p.usd for p in e.parts))
    assert e.usd > parts["trainSteps"] + 1  # the compile alone is over a dollar on a v5p-8
    # The evaluation runs on its own slice (v6e-8) at the on-demand price.
    ev = next(p for p in e.parts if p.name == "evaluation")
    assert ev.usd_per_hour == TPU_SLICES["v6e-8"].usd_per_hour
    assert e.prices_as_of == cost.PRICES_AS_OF


def test_spot_prices_the_tpu_parts_at_the_spot_share() -> None:
    on_demand = cost.run_estimate(spec(), HOURS, 1000)
    spot = cost.run_estimate(spec(tpu={"spot": True}), HOURS, 1000)
    assert spot.spot and not on_demand.spot
    for a, b in zip(on_demand.parts, spot.parts, strict=True):
        if a.name in ("trainSteps", "modelLoad", "compile", "checkpoints"):
            assert b.usd_per_hour == pytest.approx(a.usd_per_hour * cost.SPOT_SHARE, abs=0.01)
        else:
            assert b.usd_per_hour == a.usd_per_hour  # CPU Jobs are not Spot


def test_parts_the_job_does_not_run_are_left_out() -> None:
    s = spec(preflight={"enabled": False}, merge={"enabled": False, "writeAdapter": True})
    assert [p.name for p in cost.run_estimate(s, 60.0, 10).parts] == [
        "trainSteps",
        "modelLoad",
        "compile",
        "checkpoints",
    ]
    s = spec(merge={"writeAdapter": True}, evaluation={"datasetUri": "gs://b/e.jsonl", "slice": "cpu"})
    ev = next(p for p in cost.run_estimate(s, 60.0, 10).parts if p.name == "evaluation")
    assert ev.usd_per_hour == pytest.approx(cost.cpu_usd_per_hour("1", "4Gi"))


def test_a_multi_host_slice_loads_each_hosts_share() -> None:
    one = cost.run_estimate(spec(), 0.0, 1)
    four = cost.run_estimate(spec(tpu={"slice": "v5p-32"}), 0.0, 1)
    load = {e: next(p for p in e.parts if p.name == "modelLoad") for e in (one, four)}
    assert load[four].seconds == pytest.approx(load[one].seconds / 4)


def test_the_preflight_report_gets_the_whole_jobs_cost() -> None:
    pf = PreflightStatus.model_validate(
        {"fits": True, "estimatedSeconds": HOURS, "estimatedUSD": 56.11, "totalSteps": 1000}
    )
    out = cost.with_run_cost(pf, spec(tpu={"spot": True}))
    assert out.estimated_usd == round(cost.run_estimate(spec(tpu={"spot": True}), HOURS, 1000).usd, 2)
    assert out.cost_parts["trainSteps"] < 56.11 and out.cost_prices_as_of == cost.PRICES_AS_OF
    assert out.to_wire()["costPartsUSD"]["compile"] > 0
    # A report without a step count keeps its own figure.
    bare = PreflightStatus.model_validate({"fits": True, "estimatedUSD": 1.0})
    assert cost.with_run_cost(bare, spec()) == bare
