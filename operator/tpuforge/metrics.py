"""The operator's Prometheus metrics, served on /metrics.

Two sorts:
- reconcile counters, errors, conflicts and durations, labelled by kind;
- kube-state-style series about each custom object: one series per object, computed from the object's
  latest status at scrape time, gone as soon as the object is. Each kind has a `PerObjectCollector` that
  holds its objects' latest samples; the controllers `observe_*` after each reconcile and `forget_*` on
  deletion.

Every metric is documented in docs/metrics.md.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tpuforge.api import AdapterPhase, FineTuneJobStatus, FineTunePhase, ServingDeploymentStatus, ServingPhase
from tpuforge.api.finetune_status import CONDITION_EVALUATED, REASON_EVALUATION_FAILED

# --- Reconciles (every kind) --------------------------------------------------------------------------------

RECONCILES = Counter("tpuforge_reconcile", "Reconciles run, by kind.", ["kind"])
RECONCILE_ERRORS = Counter(
    "tpuforge_reconcile_errors", "Reconciles that failed with an error (retried with backoff).", ["kind"]
)
RECONCILE_CONFLICTS = Counter(
    "tpuforge_reconcile_conflicts",
    "Status writes refused because the object changed meanwhile (409); retried on the newer object.",
    ["kind"],
)
RECONCILE_DURATION = Histogram(
    "tpuforge_reconcile_duration_seconds",
    "Time to reconcile one object, API calls included.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

OPERATOR_LEADER = Gauge(
    "tpuforge_operator_leader",
    "1 while this operator process handles objects (it holds the leader Lease, or runs without leader "
    "election); 0 while it waits for the Lease as a standby.",
)


def serve(address: str, port: int) -> None:
    """Serve /metrics (default registry: the operator's series plus process CPU and memory) in a thread."""
    start_http_server(port, addr=address)


# --- Per-object series --------------------------------------------------------------------------------------

S = TypeVar("S")
ObjectKey = tuple[str, str]  # namespace, name


class PerObjectCollector(Collector, Generic[S]):
    """The latest sample of each live object of one kind; `families` renders them at scrape time."""

    def __init__(self) -> None:
        self._samples: dict[ObjectKey, S] = {}
        self._lock = threading.Lock()

    def set(self, namespace: str, name: str, sample: S) -> None:
        with self._lock:
            self._samples[(namespace, name)] = sample

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._samples.pop((namespace, name), None)

    def samples(self) -> list[S]:
        with self._lock:
            return list(self._samples.values())

    def families(self, samples: list[S]) -> Iterable[Metric]:
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        return self.families([])

    def collect(self) -> Iterator[Metric]:
        yield from self.families(self.samples())


# FineTuneJob ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FineTuneJobSample:
    namespace: str
    name: str
    model: str
    slice: str
    phase: str
    progress_ratio: float | None
    step: int | None
    loss: float | None
    tokens_per_second: float | None
    preemptions: int
    failures: int
    estimated_cost_usd: float | None
    # The evaluation: each score, by (metric, model) where model is "adapter" or "base"; the verdict; and
    # whether the evaluation Job itself failed (None: no evaluation has started).
    eval_scores: tuple[tuple[str, str, float], ...] = ()
    eval_passed: bool | None = None
    eval_failed: bool | None = None
    # DPO and ORPO: (set, accuracy, reward margin) for the last step (train) and the held-out pairs (eval).
    preference: tuple[tuple[str, float | None, float | None], ...] = ()
    # GRPO: the last step's mean reward, pass rate and refused answers over the run (None: not reported).
    rl_reward: float | None = None
    rl_pass_rate: float | None = None
    rl_refused: int | None = None


def _eval_failed(status: FineTuneJobStatus) -> bool | None:
    cond = next((c for c in status.conditions if c.type == CONDITION_EVALUATED), None)
    return None if cond is None else cond.reason == REASON_EVALUATION_FAILED


def finetunejob_sample(
    namespace: str, name: str, spec: Mapping[str, Any], status: FineTuneJobStatus
) -> FineTuneJobSample:
    prog = status.progress
    ratio = None
    if prog is not None and prog.percent is not None:
        ratio = prog.percent / 100.0
    elif prog is not None and prog.step is not None and prog.total_steps:
        ratio = min(prog.step / prog.total_steps, 1.0)
    return FineTuneJobSample(
        namespace=namespace,
        name=name,
        model=str((spec.get("model") or {}).get("name") or ""),
        slice=str((spec.get("tpu") or {}).get("slice") or ""),
        phase=(status.phase or FineTunePhase.PENDING).value,
        progress_ratio=ratio,
        step=prog.step if prog else None,
        loss=prog.loss if prog else None,
        tokens_per_second=prog.tokens_per_second if prog else None,
        preemptions=status.restarts.preemptions if status.restarts else 0,
        failures=status.restarts.failures if status.restarts else 0,
        estimated_cost_usd=status.cost.estimated_usd if status.cost else None,
        eval_scores=tuple(
            (metric, model, value)
            for model, scores in (("adapter", ev.metrics), ("base", ev.base_metrics))
            for metric, value in sorted(scores.items())
        )
        if (ev := status.evaluation) is not None
        else (),
        eval_passed=status.evaluation.passed if status.evaluation else None,
        eval_failed=_eval_failed(status),
        preference=(
            ("train", pref.accuracy, pref.reward_margin),
            ("eval", pref.eval_accuracy, pref.eval_reward_margin),
        )
        if prog is not None and (pref := prog.preference) is not None
        else (),
        rl_reward=prog.rl.reward if prog is not None and prog.rl is not None else None,
        rl_pass_rate=prog.rl.pass_rate if prog is not None and prog.rl is not None else None,
        rl_refused=prog.rl.refused_total if prog is not None and prog.rl is not None else None,
    )


_FTJ = "tpuforge_finetunejob"
_KEYS = ["namespace", "name"]


class FineTuneJobCollector(PerObjectCollector[FineTuneJobSample]):
    def families(self, samples: list[FineTuneJobSample]) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            f"{_FTJ}_info", "A FineTuneJob: its model and TPU slice (always 1).", labels=[*_KEYS, "model", "slice"]
        )
        phase = GaugeMetricFamily(
            f"{_FTJ}_phase", "1 for the FineTuneJob's current phase, 0 for the others.", labels=[*_KEYS, "phase"]
        )
        ratio = GaugeMetricFamily(f"{_FTJ}_progress_ratio", "Training steps done over total (0 to 1).", labels=_KEYS)
        step = GaugeMetricFamily(f"{_FTJ}_step", "Last optimizer step the trainer reported.", labels=_KEYS)
        loss = GaugeMetricFamily(f"{_FTJ}_loss", "Training loss at the last report.", labels=_KEYS)
        tps = GaugeMetricFamily(f"{_FTJ}_tokens_per_second", "Training throughput at the last report.", labels=_KEYS)
        restarts = CounterMetricFamily(
            f"{_FTJ}_restarts", "Training restarts, by reason (preemption, failure).", labels=[*_KEYS, "reason"]
        )
        cost = GaugeMetricFamily(
            f"{_FTJ}_estimated_cost_usd", "TPU slice-hours so far times the slice's list price.", labels=_KEYS
        )
        eval_metric = GaugeMetricFamily(
            f"{_FTJ}_eval_metric",
            "The evaluation's scores on the held-out records: the adapter's (model=adapter) and the base "
            "model's (model=base), by metric (loss, exactMatch).",
            labels=[*_KEYS, "metric", "model"],
        )
        eval_passed = GaugeMetricFamily(
            f"{_FTJ}_eval_passed", "1 when the adapter met every evaluation threshold, 0 when not.", labels=_KEYS
        )
        eval_failed = GaugeMetricFamily(
            f"{_FTJ}_eval_failed",
            "1 when the evaluation Job failed or its result was unreadable (no verdict), 0 once it started.",
            labels=_KEYS,
        )
        accuracy = GaugeMetricFamily(
            f"{_FTJ}_preference_accuracy",
            "DPO and ORPO: preference pairs ranked right (chosen reward above rejected), in the last step "
            "(set=train) and on the held-out pairs at the last evaluation (set=eval).",
            labels=[*_KEYS, "set"],
        )
        margin = GaugeMetricFamily(
            f"{_FTJ}_reward_margin",
            "DPO and ORPO: mean chosen minus rejected reward, last step (set=train) and held out (set=eval).",
            labels=[*_KEYS, "set"],
        )
        rl_reward = GaugeMetricFamily(
            f"{_FTJ}_rl_reward", "GRPO: mean reward of the last step's sampled answers.", labels=_KEYS
        )
        rl_pass = GaugeMetricFamily(
            f"{_FTJ}_rl_pass_rate", "GRPO: share of the last step's sampled answers the checker passed.", labels=_KEYS
        )
        rl_refused = GaugeMetricFamily(
            f"{_FTJ}_rl_refused_answers",
            "GRPO: sampled answers the checker refused so far (its rules against gaming the test); a rising count "
            "is a model learning to game the checker.",
            labels=_KEYS,
        )
        for s in samples:
            key = [s.namespace, s.name]
            info.add_metric([*key, s.model, s.slice], 1)
            for family, value in ((rl_reward, s.rl_reward), (rl_pass, s.rl_pass_rate), (rl_refused, s.rl_refused)):
                if value is not None:
                    family.add_metric(key, value)
            for which, acc, mar in s.preference:
                for family, value in ((accuracy, acc), (margin, mar)):
                    if value is not None:
                        family.add_metric([*key, which], value)
            for metric, model, points in s.eval_scores:
                eval_metric.add_metric([*key, metric, model], points)
            if s.eval_passed is not None:
                eval_passed.add_metric(key, 1 if s.eval_passed else 0)
            if s.eval_failed is not None:
                eval_failed.add_metric(key, 1 if s.eval_failed else 0)
            for p in FineTunePhase:
                phase.add_metric([*key, p.value], 1 if p.value == s.phase else 0)
            restarts.add_metric([*key, "preemption"], s.preemptions)
            restarts.add_metric([*key, "failure"], s.failures)
            for family, value in (
                (ratio, s.progress_ratio),
                (step, s.step),
                (loss, s.loss),
                (tps, s.tokens_per_second),
                (cost, s.estimated_cost_usd),
            ):
                if value is not None:
                    family.add_metric(key, value)
        return [
            info,
            phase,
            ratio,
            step,
            loss,
            tps,
            restarts,
            cost,
            eval_metric,
            eval_passed,
            eval_failed,
            accuracy,
            margin,
            rl_reward,
            rl_pass,
            rl_refused,
        ]


FINETUNEJOBS = FineTuneJobCollector()
REGISTRY.register(FINETUNEJOBS)


def observe_finetunejob(namespace: str, name: str, spec: Mapping[str, Any], status: FineTuneJobStatus) -> None:
    FINETUNEJOBS.set(namespace, name, finetunejob_sample(namespace, name, spec, status))


def forget_finetunejob(namespace: str, name: str) -> None:
    FINETUNEJOBS.forget(namespace, name)


# ServingDeployment ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingDeploymentSample:
    namespace: str
    name: str
    model_uri: str
    served_model: str
    slice: str
    image: str
    phase: str
    replicas: int
    ready_replicas: int
    adapters: tuple[tuple[str, int, str], ...] = ()  # each spec.adapters name: replicas serving it, phase


def servingdeployment_sample(
    namespace: str, name: str, spec: Mapping[str, Any], status: ServingDeploymentStatus, default_image: str = ""
) -> ServingDeploymentSample:
    """`default_image`: the operator's vLLM image, for a spec that names none."""
    vllm = spec.get("vllm") or {}
    return ServingDeploymentSample(
        namespace=namespace,
        name=name,
        model_uri=status.model_uri or "",
        served_model=str(vllm.get("servedModelName") or name),
        slice=str((spec.get("tpu") or {}).get("slice") or ""),
        image=str(vllm.get("image") or default_image),
        phase=(status.phase or ServingPhase.PENDING).value,
        replicas=int(spec.get("replicas", 1) or 0),
        ready_replicas=status.ready_replicas or 0,
        adapters=tuple((a.name, a.loaded_replicas, a.phase.value) for a in status.adapters),
    )


_SDEP = "tpuforge_servingdeployment"


class ServingDeploymentCollector(PerObjectCollector[ServingDeploymentSample]):
    def __init__(self) -> None:
        super().__init__()
        # The last load of each adapter, by (namespace, name) then adapter: kept across reconciles, forgotten
        # with the object or the adapter.
        self._load_seconds: dict[ObjectKey, dict[str, float]] = {}

    def observe_load(self, namespace: str, name: str, adapter: str, seconds: float) -> None:
        with self._lock:
            self._load_seconds.setdefault((namespace, name), {})[adapter] = seconds

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._samples.pop((namespace, name), None)
            self._load_seconds.pop((namespace, name), None)

    def load_seconds(self) -> dict[ObjectKey, dict[str, float]]:
        with self._lock:
            return {k: dict(v) for k, v in self._load_seconds.items()}

    def families(self, samples: list[ServingDeploymentSample]) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            f"{_SDEP}_info",
            "A ServingDeployment: the model it serves, the name clients use, its TPU slice and vLLM image (always 1).",
            labels=[*_KEYS, "model_uri", "served_model", "slice", "image"],
        )
        phase = GaugeMetricFamily(
            f"{_SDEP}_phase", "1 for the ServingDeployment's current phase, 0 for the others.", labels=[*_KEYS, "phase"]
        )
        replicas = GaugeMetricFamily(f"{_SDEP}_replicas", "vLLM server replicas the spec asks for.", labels=_KEYS)
        ready = GaugeMetricFamily(f"{_SDEP}_ready_replicas", "vLLM server replicas answering /health.", labels=_KEYS)
        loaded = GaugeMetricFamily(
            f"{_SDEP}_adapter_loaded",
            "Ready replicas serving each LoRA adapter of spec.adapters (0 while it loads or failed).",
            labels=[*_KEYS, "adapter"],
        )
        load_seconds = GaugeMetricFamily(
            f"{_SDEP}_adapter_load_seconds",
            "Seconds the last load of each adapter took on a replica: the fetch into the pod plus vLLM's load.",
            labels=[*_KEYS, "adapter"],
        )
        adapter_phase = GaugeMetricFamily(
            f"{_SDEP}_adapter_phase",
            "1 for each adapter's current phase (Loading, Ready, Failed), 0 for the others.",
            labels=[*_KEYS, "adapter", "phase"],
        )
        last_loads = self.load_seconds()
        for s in samples:
            key = [s.namespace, s.name]
            info.add_metric([*key, s.model_uri, s.served_model, s.slice, s.image], 1)
            for p in ServingPhase:
                phase.add_metric([*key, p.value], 1 if p.value == s.phase else 0)
            replicas.add_metric(key, s.replicas)
            ready.add_metric(key, s.ready_replicas)
            seconds = last_loads.get((s.namespace, s.name), {})
            for adapter, n, current in s.adapters:
                loaded.add_metric([*key, adapter], n)
                for ap in AdapterPhase:
                    adapter_phase.add_metric([*key, adapter, ap.value], 1 if ap.value == current else 0)
                if adapter in seconds:
                    load_seconds.add_metric([*key, adapter], seconds[adapter])
        return [info, phase, replicas, ready, loaded, adapter_phase, load_seconds]


SERVINGDEPLOYMENTS = ServingDeploymentCollector()
REGISTRY.register(SERVINGDEPLOYMENTS)


def observe_servingdeployment(
    namespace: str, name: str, spec: Mapping[str, Any], status: ServingDeploymentStatus, default_image: str = ""
) -> None:
    SERVINGDEPLOYMENTS.set(namespace, name, servingdeployment_sample(namespace, name, spec, status, default_image))


def observe_adapter_load(namespace: str, name: str, adapter: str, seconds: float) -> None:
    SERVINGDEPLOYMENTS.observe_load(namespace, name, adapter, seconds)


def forget_servingdeployment(namespace: str, name: str) -> None:
    SERVINGDEPLOYMENTS.forget(namespace, name)
