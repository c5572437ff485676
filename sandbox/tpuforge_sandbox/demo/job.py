"""The demo's FineTuneJob and ServingDeployment documents (examples/*-demo.yaml), read and checked against the
sandbox before anything starts: each spec parsed as the operator parses it, every URI of the job in the
sandbox's bucket, and the job moved to the slice of as many hosts as `--hosts` asks. Also DemoError, the error
every demo step raises when it cannot go on."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec, SpecError, parse
from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.constants import FINETUNEJOB_KIND
from tpuforge.api.validation import check_finetune
from tpuforge_sandbox import gcs_objects

M = TypeVar("M", FineTuneJobSpec, ServingDeploymentSpec)
FINETUNE_YAML = Path("examples/finetune-demo.yaml")
SERVING_YAML = Path("examples/serving-demo.yaml")
# Every demo's ServingDeployment: a demo run removes them all, as they need the same node and port.
SERVING_YAMLS = (SERVING_YAML, Path("examples/serving-adapters-demo.yaml"))


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and where to look."""


@dataclass(frozen=True)
class DemoJob:
    """A FineTuneJob document of a demo (examples/finetune-*demo.yaml), read and checked against the sandbox."""

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


def load_jobs(path: Path, bucket: str) -> list[DemoJob]:
    """Every FineTuneJob document of `path` (a demo of several jobs), each checked as `load_job` checks one."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if not docs or any(not isinstance(d, dict) or d.get("kind") != FINETUNEJOB_KIND for d in docs):
        raise DemoError(f"{path}: expected {FINETUNEJOB_KIND} documents only")
    return [job_from_body(path, doc, bucket) for doc in docs]


def job_from_body(path: Path, body: dict[str, Any], bucket: str) -> DemoJob:
    """A FineTuneJob document of `path`, checked: its spec, and every URI in the sandbox's bucket (a model
    named by spec.model.fineTuneJobRef is that job's output, checked with it)."""
    spec = parse_spec(path, FineTuneJobSpec, body)
    for field, uri in (
        ("spec.model.uri", spec.model.uri),
        ("spec.dataset.uri", spec.dataset.uri),
        ("spec.checkpoint.uri", spec.checkpoint.uri),
        ("spec.output.uri", spec.output.uri),
    ):
        if uri is not None and gcs_objects.split_uri(uri)[0] != bucket:
            raise DemoError(
                f"{path}: {field} {uri} is not in the sandbox's bucket gs://{bucket}; use gs://{bucket}/..."
            )
    return DemoJob(body, checked(path, spec))


def checked(path: Path, spec: FineTuneJobSpec) -> FineTuneJobSpec:
    """`spec`, if the operator would run it (the sandbox's pods read local files too); else why not."""
    errors = check_finetune(spec, local_paths=True)
    if errors:
        raise DemoError(f"{path}: " + "; ".join(f"{e.field}: {e.message}" for e in errors))
    return spec


def for_hosts(job: DemoJob, hosts: int) -> DemoJob:
    """The demo job on the slice of the same TPU generation with `hosts` hosts: its default mesh, or the job's
    tensor parallelism with fsdp over the rest; and the same run. Each fsdp replica takes microBatchSize
    examples, so microBatchSize is scaled by the ratio of the meshes' fsdp to keep the examples of a step (and
    with them the records of each step, in the same order) as on the job's own slice."""
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
    tpu = {k: v for k, v in (spec.get("tpu") or {}).items() if k != "mesh"} | {"slice": chosen.id}
    if job.spec.tpu.mesh is not None:
        tp = job.spec.tpu.mesh.tp
        tpu["mesh"] = {"fsdp": chosen.chips // tp, "tp": tp}
    spec["tpu"] = tpu
    fsdp = job.spec.tpu.mesh.fsdp if job.spec.tpu.mesh is not None else current.default_fsdp
    new_fsdp = tpu["mesh"]["fsdp"] if "mesh" in tpu else chosen.default_fsdp
    rows = job.spec.training.micro_batch_size * fsdp
    if rows % new_fsdp:
        raise DemoError(
            f"--hosts {hosts}: {rows} examples a micro-batch do not split over the {new_fsdp} fsdp replicas of "
            f"{chosen.id}; make spec.training.microBatchSize a multiple of {new_fsdp // math.gcd(rows, new_fsdp)}"
        )
    spec["training"] = {**spec["training"], "microBatchSize": rows // new_fsdp}
    body = {**job.body, "spec": spec}
    return DemoJob(body, checked(FINETUNE_YAML, parse_spec(FINETUNE_YAML, FineTuneJobSpec, body)))
