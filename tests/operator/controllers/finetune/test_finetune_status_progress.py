"""What the operator derives from the trainer's progress: percent, ETA and cost; and the metrics it exports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tpuforge import api
from tpuforge.controllers.finetune.children import JobView, pod_view
from tpuforge.controllers.finetune.plan import Observed, eta_seconds, plan, status_patch, tpu_hours
from tpuforge.metrics import FineTuneJobCollector, finetunejob_sample

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = {
    "model": {"name": "gemma4-31b", "uri": "gs://b/m"},
    "dataset": {"uri": "gs://b/d.jsonl"},
    "training": {"maxSeqLen": 3072},
    "tpu": {"slice": "v5p-8"},
    "checkpoint": {"uri": "gs://b/ck"},
    "output": {"uri": "gs://b/out"},
    "serviceAccountName": "tpuforge-gcs",
}


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def status(**kw: object) -> api.FineTuneJobStatus:
    return api.FineTuneJobStatus.model_validate(kw)


def test_eta_uses_the_current_attempts_rate_since_it_resumed() -> None:
    st = status(
        phase="Training",
        attempt=1,
        attempts=[
            {"attempt": 0, "jobName": "j-train-0", "startTime": at(0), "endTime": at(1000), "outcome": "Preempted"},
            {"attempt": 1, "jobName": "j-train-1", "startStep": 400, "startTime": at(2000)},
        ],
        progress={"step": 600, "totalSteps": 1000, "updatedAt": at(2400)},
    )
    # 200 steps in 400 s since the resume: 400 steps left take 800 s.
    assert eta_seconds(st) == 800


def test_no_eta_without_a_rate() -> None:
    assert eta_seconds(status(progress={"step": 5, "totalSteps": 10})) is None
    st = status(
        attempt=0,
        attempts=[{"attempt": 0, "jobName": "j", "startTime": at(10)}],
        progress={"step": 0, "totalSteps": 10, "updatedAt": at(5)},
    )
    assert eta_seconds(st) is None


def test_tpu_hours_add_finished_attempts_and_the_running_one() -> None:
    attempts = [
        api.AttemptStatus(attempt=0, job_name="a", start_time=at(0), end_time=at(1800), outcome="Preempted"),
        api.AttemptStatus(attempt=1, job_name="b"),  # never ran: no TPU time
        api.AttemptStatus(attempt=2, job_name="c", start_time=at(3600)),
    ]
    assert tpu_hours(attempts, T0 + timedelta(seconds=5400)) == 1.0


def test_plan_derives_percent_eta_and_cost_and_keeps_the_trainers_fields() -> None:
    st = status(
        phase="Training",
        attempt=0,
        attempts=[{"attempt": 0, "jobName": "j-train-0", "startTime": at(0), "podName": "p"}],
        progress={"step": 250, "totalSteps": 1000, "loss": 0.9, "tokensPerSecond": 763.0, "updatedAt": at(3600)},
    )
    pod = {
        "metadata": {"name": "p", "labels": {"job-name": "j-train-0"}},
        "spec": {"containers": [{"name": "trainer"}]},
        "status": {"phase": "Running"},
    }
    job = JobView("j-train-0", "trainer", 0, False, False, "", False)
    o = Observed("ns", "j", "u", 1, SPEC, st, jobs=(job,), pods=(pod_view(pod),))
    out = plan(o, T0 + timedelta(seconds=7200)).status
    assert out.progress is not None
    assert out.progress.percent == 25.0
    assert out.progress.eta_seconds == 3 * 3600
    assert (out.progress.loss, out.progress.tokens_per_second, out.progress.step) == (0.9, 763.0, 250)
    assert out.cost == api.Cost(tpu_hours=2.0, estimated_usd=33.6, estimated_usd_display="$33.60")
    assert (out.progress.percent_display, out.progress.eta_display) == ("25%", "3h")


def test_plan_keeps_the_trainers_windowed_eta_while_training() -> None:
    st = status(
        phase="Training",
        attempt=0,
        attempts=[{"attempt": 0, "jobName": "j-train-0", "startTime": at(0), "podName": "p"}],
        progress={"step": 250, "totalSteps": 1000, "etaSeconds": 101, "updatedAt": at(3600)},
    )
    pod = {
        "metadata": {"name": "p", "labels": {"job-name": "j-train-0"}},
        "spec": {"containers": [{"name": "trainer"}]},
        "status": {"phase": "Running"},
    }
    job = JobView("j-train-0", "trainer", 0, False, False, "", False)
    o = Observed("ns", "j", "u", 1, SPEC, st, jobs=(job,), pods=(pod_view(pod),))
    p = plan(o, T0 + timedelta(seconds=3700))
    assert p.status.progress is not None
    assert (p.status.progress.eta_seconds, p.status.progress.eta_display) == (101, "1m41s")
    patch = status_patch(st, p.status)
    assert patch["progress"] == {"percentDisplay": "25%", "etaDisplay": "1m41s", "percent": 25.0}
    assert patch["cost"]["estimatedUSDDisplay"] == "$17.27"  # 3700 s of a $16.80/h slice


def test_metrics_one_series_per_object_gone_with_the_object() -> None:
    collector = FineTuneJobCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    st = status(
        phase="Training",
        restarts={"preemptions": 2, "failures": 1},
        progress={"step": 30, "totalSteps": 120, "percent": 25.0, "loss": 1.5, "tokensPerSecond": 700.0},
        cost={"tpuHours": 1.0, "estimatedUSD": 16.8},
    )
    collector.set("ns", "a", finetunejob_sample("ns", "a", SPEC, st))
    collector.set("ns", "b", finetunejob_sample("ns", "b", SPEC, status()))

    def series() -> list[tuple[str, dict[str, str], float]]:
        text = generate_latest(registry).decode()
        return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]

    def value(metric: str, **labels: str) -> float | None:
        found = [v for n, lab, v in series() if n == metric and lab == labels]
        assert len(found) <= 1
        return found[0] if found else None

    a = {"namespace": "ns", "name": "a"}
    assert value("tpuforge_finetunejob_info", **a, model="gemma4-31b", slice="v5p-8") == 1
    assert value("tpuforge_finetunejob_phase", **a, phase="Training") == 1
    assert value("tpuforge_finetunejob_phase", **a, phase="Pending") == 0
    assert value("tpuforge_finetunejob_progress_ratio", **a) == 0.25
    assert value("tpuforge_finetunejob_step", **a) == 30
    assert value("tpuforge_finetunejob_loss", **a) == 1.5
    assert value("tpuforge_finetunejob_tokens_per_second", **a) == 700
    assert value("tpuforge_finetunejob_restarts_total", **a, reason="preemption") == 2
    assert value("tpuforge_finetunejob_restarts_total", **a, reason="failure") == 1
    assert value("tpuforge_finetunejob_estimated_cost_usd", **a) == 16.8
    # An object without progress has no progress series (absent, not zero), and its phase defaults to Pending.
    b = {"namespace": "ns", "name": "b"}
    assert value("tpuforge_finetunejob_step", **b) is None
    assert value("tpuforge_finetunejob_phase", **b, phase="Pending") == 1
    collector.forget("ns", "a")
    assert not any(lab.get("name") == "a" for _, lab, _ in series())


def test_preference_progress_is_exported_per_set_and_absent_for_sft() -> None:
    collector = FineTuneJobCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    pref = {"accuracy": 0.75, "rewardMargin": 1.5, "evalStep": 10, "evalAccuracy": 0.5}
    collector.set("ns", "dpo", finetunejob_sample("ns", "dpo", SPEC, status(progress={"step": 11, "preference": pref})))
    collector.set("ns", "sft", finetunejob_sample("ns", "sft", SPEC, status(progress={"step": 11, "loss": 1.0})))
    text = generate_latest(registry).decode()
    found = {
        (s.name, s.labels["name"], s.labels.get("set")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(("tpuforge_finetunejob_preference", "tpuforge_finetunejob_reward"))
    }
    assert found == {
        ("tpuforge_finetunejob_preference_accuracy", "dpo", "train"): 0.75,
        ("tpuforge_finetunejob_preference_accuracy", "dpo", "eval"): 0.5,
        ("tpuforge_finetunejob_reward_margin", "dpo", "train"): 1.5,
    }


def test_a_checkpoint_slower_than_the_spot_grace_period_says_so_in_a_condition() -> None:
    spot = {**SPEC, "tpu": {"slice": "v5p-8", "spot": True}, "checkpoint": {"uri": "gs://b/ck", "everySteps": 50}}
    job = JobView("j-train-0", "trainer", 0, False, False, "", False)

    def condition(seconds: float, spec: dict[str, object]) -> api.Condition:
        st = status(
            phase="Training",
            attempt=0,
            attempts=[{"attempt": 0, "jobName": "j-train-0", "startTime": at(0)}],
            progress={"step": 100, "totalSteps": 1000, "lastCheckpoint": {"step": 100, "seconds": seconds, "bytes": 1}},
        )
        out = plan(Observed("ns", "j", "u", 1, spec, st, jobs=(job,)), T0 + timedelta(seconds=60)).status
        return next(c for c in out.conditions if c.type == "CheckpointWithinGrace")

    slow = condition(22.5, spot)
    assert (slow.status, slow.reason) == ("False", "SaveExceedsGracePeriod")
    assert "took 22.5 s" in slow.message and "15 s grace period" in slow.message
    assert "up to checkpoint.everySteps=50 steps" in slow.message
    fast = condition(4.0, spot)
    assert (fast.status, fast.reason) == ("True", "SaveFitsGracePeriod")
    # Off Spot the pods get 300 s.
    assert condition(22.5, SPEC).status == "True"


def test_rl_progress_is_exported_and_absent_for_other_methods() -> None:
    collector = FineTuneJobCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    rl = {"reward": 0.5, "passRate": 0.25, "refused": 1, "refusedTotal": 3}
    collector.set("ns", "rl", finetunejob_sample("ns", "rl", SPEC, status(progress={"step": 4, "rl": rl})))
    collector.set("ns", "sft", finetunejob_sample("ns", "sft", SPEC, status(progress={"step": 4, "loss": 1.0})))
    text = generate_latest(registry).decode()
    found = {
        (s.name, s.labels["name"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("tpuforge_finetunejob_rl_")
    }
    assert found == {
        ("tpuforge_finetunejob_rl_reward", "rl"): 0.5,
        ("tpuforge_finetunejob_rl_pass_rate", "rl"): 0.25,
        ("tpuforge_finetunejob_rl_refused_answers", "rl"): 3,
    }
