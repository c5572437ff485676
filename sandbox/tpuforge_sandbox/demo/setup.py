"""The demo's first steps, each a function of the session: the jobs' documents read and checked, the sandbox up
and its emulated nodes listed, the operator (re)started as one of the sandbox's processes, the tiny base model
and the datasets written to GCS (model work runs in subprocesses of the workloads package), and the FineTuneJob
applied once an earlier run's objects, pods and outputs are gone."""

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
from tpuforge.api.finetune import PREFERENCE_METHODS
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.config import K8S_VERSION, cache_dir
from tpuforge_sandbox.demo.job import SERVING_YAMLS, DemoError, DemoJob, for_hosts, load_job, load_jobs, load_yaml
from tpuforge_sandbox.demo.session import NAMESPACE, DemoSession
from tpuforge_sandbox.demo.view import size
from tpuforge_sandbox.kubeapi import Kube
from tpuforge_sandbox.operator_command import operator_argv, operator_env
from tpuforge_sandbox.procs import free_port, port_free
from tpuforge_sandbox.sandbox import OPERATOR, wait_for

OPERATOR_METRICS_PORT = 8080
DATASET = Path("examples/data/demo-chat.jsonl")
DATA = Path("examples/data")


def read_job(s: DemoSession) -> None:
    """The scenario's one FineTuneJob, on the slice of `--hosts` hosts: read and checked before anything starts."""
    s.jobs = [for_hosts(load_job(s.root / s.scenario.jobs_yaml, s.sb.bucket), s.hosts)]


def read_jobs(s: DemoSession) -> None:
    """The scenario's FineTuneJobs, read and checked before anything starts."""
    s.jobs = load_jobs(s.root / s.scenario.jobs_yaml, s.sb.bucket)


def sandbox_title(s: DemoSession) -> str:
    return f"Sandbox: Kubernetes {K8S_VERSION} with JobSet and Kueue, fake GCS, emulated TPU nodes"


def start_sandbox(s: DemoSession) -> None:
    if not s.sb.running():
        # Training pods inherit a persistent XLA compilation cache from the node agent `up` starts here.
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir() / "jax-cache"))
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    s.sb.up(timeout=180)
    s.say(f"sandbox in {s.sb.dir}; kubeconfig {s.sb.kubeconfig}")
    s.say(f"GCS {s.sb.gcs_url} (bucket gs://{s.sb.bucket}); emulated nodes:")
    for n in Kube(s.api).list_nodes(""):
        labels = n["metadata"].get("labels") or {}
        chips = (n["status"].get("allocatable") or {}).get(TPU_RESOURCE, "0")
        spot = ", spot" if labels.get(GKE_SPOT) == "true" else ""
        accel = labels.get(GKE_TPU_ACCELERATOR, "cpu")
        topology = labels.get(GKE_TPU_TOPOLOGY)
        accel += f" {topology}" if topology else ""
        s.say(f"  {n['metadata']['name']:<16} {accel}{spot}, {TPU_RESOURCE}: {chips}")
    if not s.kubectl:
        s.say("kubectl is not on PATH: the `kubectl get` tables are left out")
    start_operator(s)


def check_nodes(s: DemoSession) -> None:
    """The sandbox has the job's slice (one started before multi-host pools were the default may not)."""
    assert s.job is not None
    tpu_slice = TPU_SLICES[s.job.spec.tpu.slice]
    nodes = Kube(s.api).list_nodes(
        f"{GKE_TPU_ACCELERATOR}={tpu_slice.accelerator},{GKE_TPU_TOPOLOGY}={tpu_slice.topology}"
    )
    if len(nodes) < tpu_slice.hosts:
        raise DemoError(
            f"the running sandbox has no {tpu_slice.id} node pool ({tpu_slice.hosts} nodes of topology "
            f"{tpu_slice.topology}): stop it with `{s.tpuforge} sandbox down` and run the demo again, which "
            "starts one with the default node pools"
        )


def start_operator(s: DemoSession) -> None:
    """(Re)start `tpuforge operator` as a managed process of the sandbox: `tpuforge sandbox down` stops it."""
    daemon = s.sb.daemon(OPERATOR)
    if daemon.stop(timeout=15):
        s.say("stopped the operator of an earlier run")
    port = OPERATOR_METRICS_PORT if port_free(OPERATOR_METRICS_PORT) else free_port()
    pid = daemon.start(operator_argv(s.sb.kubeconfig, port), env=operator_env())

    def metrics_up() -> bool:
        if daemon.pid() is None:
            raise DemoError(f"the operator exited at start; last lines of {daemon.log}:\n{daemon.log_tail()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).close()
        except OSError:
            return False
        return True

    wait_for(metrics_up, 60, "the operator's /metrics", interval=0.3)
    s.operator_port = port
    s.say(f"operator running (pid {pid}): metrics http://127.0.0.1:{port}/metrics, log {daemon.log}")


def write_inputs(s: DemoSession) -> None:
    """The job's tiny model and the demo's chat dataset, for the (first) job."""
    assert s.job is not None
    spec, url = s.job.spec, s.sb.gcs_url
    write_model(s, spec.model.name, spec.model.location)
    data = (s.root / DATASET).read_bytes()
    gcs_objects.upload(url, spec.dataset.uri, data)
    first = json.loads(data.splitlines()[0])["messages"]
    s.say(f"{DATASET} -> {spec.dataset.uri}: {len(data.splitlines())} chat records, e.g.")
    for m in first:
        s.say(f"  {m['role']:>9}: {m['content']}")


def upload_data(s: DemoSession) -> None:
    """Each job's training and evaluation data from examples/data (named as in its URIs) to GCS."""
    url = s.sb.gcs_url
    uris = [u for job in s.jobs for u in (job.spec.dataset.uri, job.spec.dataset.eval_uri) if u is not None]
    for uri in dict.fromkeys(uris):  # each once, in order
        local = s.root / DATA / uri.rsplit("/", 1)[-1]
        if not local.exists():
            raise DemoError(f"{s.scenario.jobs_yaml}: {uri} should be {local}, which does not exist")
        gcs_objects.upload(url, uri, local.read_bytes())
        s.say(f"{local.relative_to(s.root)} -> {uri}: {len(local.read_bytes().splitlines())} records")


# The catalog's tiny models the demos write, by name: the module that writes one, what it is, and whether
# it trains its tokenizer on a chosen text (--tokenizer).
TINY_MODELS = {
    "gemma4-tiny": ("tpuforge_workloads.families.gemma4.tiny", "the tiny Gemma 4", True),
    "qwen3-tiny": ("tpuforge_workloads.families.qwen3.tiny", "the tiny Qwen3", False),
}


def write_model(s: DemoSession, name: str, uri: str, tokenizer: str = "chat") -> None:
    """The tiny model `name` at `uri` in GCS (unless it is there); a Gemma 4's tokenizer trained on
    `tokenizer`'s text (Qwen3's on the chat text)."""
    if name not in TINY_MODELS:
        raise DemoError(f"spec.model.name {name!r}: the demo writes {sorted(TINY_MODELS)}")
    module, what, chosen_text = TINY_MODELS[name]
    url = s.sb.gcs_url
    if gcs_objects.exists(url, f"{uri}/config.json"):
        s.say(f"{uri}: {what} is already there")
    else:
        args = ["-m", module, "--out", uri, *(["--tokenizer", tokenizer] if chosen_text else [])]
        run_tool(s, args, f"writing {what}")
    files = gcs_objects.list_objects(url, uri)
    s.say(f"{uri}: " + ", ".join(f"{o.name.rsplit('/', 1)[-1]} ({size(o.size)})" for o in files))
    config = json.loads(gcs_objects.read(url, f"{uri}/config.json"))
    layers = ", ".join(config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"])
    s.say(
        f"  {config['architectures'][0]}, tiny: {config['num_hidden_layers']} layers ({layers}), "
        f"hidden {config['hidden_size']}, {config['num_attention_heads']} heads, vocabulary "
        f"{config['vocab_size']} ({tokenizer} tokenizer), random weights"
    )


def run_tool(s: DemoSession, args: Sequence[str], what: str) -> str:
    """A workloads command in a subprocess with the sandbox's GCS environment; its stdout."""
    log = s.sb.config.logs_dir / "demo-tools.log"
    with s.console.status(what + "..."), log.open("ab") as err:
        out = subprocess.run(
            [sys.executable, *args], env=s.env(), stdout=subprocess.PIPE, stderr=err, cwd=s.root, check=False
        )
    if out.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise DemoError(f"{what} failed (exit {out.returncode}); last lines of {log}:\n{tail}")
    return out.stdout.decode()


def apply_title(s: DemoSession) -> str:
    assert s.job is not None
    return f"FineTuneJob {s.job.name}: {s.scenario.jobs_yaml}"


def apply_job(s: DemoSession) -> None:
    job = s.job
    assert job is not None
    remove_previous(s, [job])
    kube_objects.create(s.api, namespaced(job.body))
    spec = job.spec
    s.say(f"$ kubectl apply -f {s.scenario.jobs_yaml}\nfinetunejob.tpuforge.dev/{job.name} created")
    tpu_slice = TPU_SLICES[spec.tpu.slice]
    fsdp = spec.tpu.mesh.fsdp if spec.tpu.mesh else tpu_slice.default_fsdp
    t = spec.training
    examples = t.micro_batch_size * fsdp * t.gradient_accumulation_steps
    unit = "pairs" if spec.method in PREFERENCE_METHODS else "examples"
    s.say(
        f"  {spec.model.name} + LoRA rank {spec.lora.rank} (alpha {spec.lora.alpha:g}) on {spec.tpu.slice}"
        f"{' (spot)' if spec.tpu.spot else ''}: {t.max_steps} steps of "
        f"{examples} {unit}, lr {t.learning_rate:g}, checkpoints every "
        f"{spec.checkpoint.every_steps} steps to {spec.checkpoint.uri}, then "
        + (
            f"a merge into {spec.output.uri}{' verified against transformers' if spec.merge.verify else ''}"
            if spec.merge.enabled
            else f"the adapter exported to {spec.output.uri}"
        )
    )
    if tpu_slice.hosts > 1:
        mesh = spec.tpu.mesh
        fsdp, tp = (mesh.fsdp, mesh.tp) if mesh else (tpu_slice.default_fsdp, tpu_slice.default_tp)
        s.say(
            f"  {spec.tpu.slice} has {tpu_slice.hosts} hosts: the operator creates a JobSet of {tpu_slice.hosts} "
            f"pods, one per host, each one JAX process; together one mesh of fsdp {fsdp} x tp {tp} over all "
            "their devices"
        )


def namespaced(body: dict[str, Any]) -> dict[str, Any]:
    """A demo document in the demo's namespace."""
    return {**body, "metadata": {**body["metadata"], "namespace": NAMESPACE}}


def remove_previous(s: DemoSession, jobs: Sequence[DemoJob]) -> None:
    """Delete an earlier run's jobs, every demo ServingDeployment (they share the v6e-8 node and the vLLM port)
    and the jobs' outputs, and wait until their pods are gone (a trainer still running would write a checkpoint
    into the fresh run)."""
    api = s.api
    servings = [load_yaml(s.root / path, SERVING_KIND)["metadata"]["name"] for path in SERVING_YAMLS]
    gone = []
    for serving in servings:
        if kube_objects.delete(api, API_VERSION, SERVING_KIND, NAMESPACE, serving):
            gone.append(f"ServingDeployment {serving}")
    for job in jobs:
        if kube_objects.delete(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name):
            gone.append(f"FineTuneJob {job.name}")
    selectors = [f"{LABEL_FINETUNEJOB}={j.name}" for j in jobs] + [f"{LABEL_SERVING}={name}" for name in servings]

    def quiet() -> bool:
        return not any(kube_objects.list_objects(api, "v1", "Pod", NAMESPACE, sel) for sel in selectors) and not any(
            kube_objects.get(api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, j.name) for j in jobs
        )

    if gone:
        with s.console.status(f"removing the previous run ({', '.join(gone)})..."):
            wait_for(quiet, 120, "the previous demo run's pods to stop", interval=0.5)
    outputs = [uri for j in jobs for uri in (j.spec.checkpoint.uri, j.spec.output.uri)]
    removed = sum(gcs_objects.delete_dir(s.sb.gcs_url, uri) for uri in outputs)
    if gone or removed:
        s.say(f"removed the previous run: {', '.join(gone) or 'no objects'}, {removed} files in GCS")
