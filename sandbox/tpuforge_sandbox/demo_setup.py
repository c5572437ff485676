"""The demo's first steps (`SetupSteps`, a mixin of `DemoBase`): the sandbox up and its emulated nodes listed,
the operator (re)started as one of the sandbox's processes, the tiny base model and the dataset written to
GCS (model work runs in subprocesses of the workloads package), and the FineTuneJob applied once an earlier
run's objects, pods and outputs are gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.constants import (
    API_VERSION,
    FINETUNEJOB_KIND,
    GKE_SPOT,
    GKE_TPU_ACCELERATOR,
    GKE_TPU_TOPOLOGY,
    LABEL_FINETUNEJOB,
    LABEL_SERVING,
    SERVING_KIND,
    TPU_RESOURCE,
)
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.config import K8S_VERSION, cache_dir
from tpuforge_sandbox.demo_base import NAMESPACE, DemoBase
from tpuforge_sandbox.demo_job import FINETUNE_YAML, SERVING_YAMLS, DemoError, DemoJob, load_yaml
from tpuforge_sandbox.demo_view import heading, size
from tpuforge_sandbox.kubeapi import Kube
from tpuforge_sandbox.operator_command import operator_argv, operator_env
from tpuforge_sandbox.procs import free_port, port_free
from tpuforge_sandbox.sandbox import OPERATOR, wait_for

OPERATOR_METRICS_PORT = 8080
DATASET = Path("examples/data/demo-chat.jsonl")


class SetupSteps(DemoBase):
    """The steps before the job runs: sandbox and operator, inputs in GCS, the job applied."""

    def start_sandbox(self) -> None:
        heading(
            self.console,
            1,
            self.sections,
            f"Sandbox: Kubernetes {K8S_VERSION} with JobSet and Kueue, fake GCS, emulated TPU nodes",
        )
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
        pid = daemon.start(operator_argv(self.sb.kubeconfig, port), env=operator_env())

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
            args = ["-m", "tpuforge_workloads.tiny.gemma4", "--out", model, "--tokenizer", tokenizer]
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
