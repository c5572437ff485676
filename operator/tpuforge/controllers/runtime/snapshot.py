"""What a controller reads of one of its objects (a FineTuneJob or a ServingDeployment), out of its watch event:
one type for both kinds. The FineTuneJob controller's reconcile reads it, and from the same informer the
ServingDeployment controller's look at the models jobs make."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.controllers.runtime.informer import Informer

Key = tuple[str, str]


@dataclass(frozen=True)
class Snapshot:
    """What the reconcile needs of an object, out of its watch event. `spec` and `status` are the event's
    parsed JSON, which nothing mutates: each event brings new dicts. `annotations` holds only those the kind's
    reconcile reads (a change of any other asks for no reconcile)."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str
    deleting: bool
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> dict[str, Any]:
        """The object as kube_objects.patch_status and kube_events.post_event address it."""
        return {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "metadata": {"namespace": self.namespace, "name": self.name, "uid": self.uid},
        }


def job_object(job: Snapshot | None) -> dict[str, Any] | None:
    """A FineTuneJob as another object's resolution reads it (tpuforge.api.job_models: metadata, spec, status)."""
    if job is None:
        return None
    meta = {"namespace": job.namespace, "name": job.name, "uid": job.uid}
    return {"metadata": meta, "spec": job.spec, "status": job.status}


class JobsByName:
    """FineTuneJobs by (namespace, name), as other objects read them (a ServingDeployment's model and adapters,
    another FineTuneJob's starting model), kept from the FineTuneJob informer's events."""

    def __init__(self) -> None:
        self._jobs: dict[Key, Snapshot] = {}

    def get(self, name: Key) -> Snapshot | None:
        return self._jobs.get(name)

    def changed(self, before: Snapshot | None, after: Snapshot | None) -> Key | None:
        """Keep `after` (or forget `before`, deleted); the job's (namespace, name) where what others read of it
        (`model_view`) may have changed, so that what depends on it is woken; None where it did not."""
        job = after or before
        if job is None:
            return None
        name = (job.namespace, job.name)
        if after is not None:
            self._jobs[name] = after
        elif self._jobs.get(name) is before:
            self._jobs.pop(name, None)
        if before is not None and after is not None and model_view(before) == model_view(after):
            return None
        return name


def model_view(job: Snapshot) -> tuple[str, ...]:
    """What the resolutions of a FineTuneJob's outputs read of it (a ServingDeployment's model and adapters, another
    FineTuneJob's starting model): a change elsewhere in it changes none of them."""
    status, spec = job.status, job.spec
    outputs, evaluation = status.get("outputs") or {}, status.get("evaluation") or {}
    return (
        job.uid,
        str(status.get("phase") or ""),
        str(outputs.get("mergedModelUri") or ""),
        str(outputs.get("adapterUri") or ""),
        str(evaluation.get("passed")),
        str(status.get("completionTime") or ""),
        str((spec.get("model") or {}).get("name") or ""),
        str((spec.get("lora") or {}).get("rank") or ""),
        str(spec.get("evaluation") is not None),
    )


def object_key(body: Mapping[str, Any]) -> Key:
    """(namespace, uid): how the informer of FineTuneJobs keys them."""
    meta = body.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("uid", "")


def name_key(body: Mapping[str, Any]) -> Key:
    """(namespace, name): how the informer of ServingDeployments keys them."""
    meta = body.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def snapshot(body: Mapping[str, Any], kind: str = FINETUNEJOB_KIND, annotations: Collection[str] = ()) -> Snapshot:
    """The Snapshot of `body`, an object of `kind`, keeping only the `annotations` named."""
    meta = body.get("metadata") or {}
    return Snapshot(
        kind=kind,
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        resource_version=meta.get("resourceVersion", ""),
        deleting=bool(meta.get("deletionTimestamp")),
        spec=body.get("spec") or {},
        status=body.get("status") or {},
        annotations={k: v for k, v in (meta.get("annotations") or {}).items() if k in annotations},
    )


def finetunejob_informer(
    namespaces: Sequence[str] | None, on_change: Callable[[Key, Snapshot | None, Snapshot | None], None]
) -> Informer[Key, Snapshot]:
    """An informer of every FineTuneJob in `namespaces`, as Snapshots keyed by object_key (for a
    ServingDeployment controller that runs without the FineTuneJob controller, whose informer it is otherwise)."""
    return Informer(
        api_version=API_VERSION,
        kind=FINETUNEJOB_KIND,
        label_selector="",
        namespaces=namespaces,
        view=snapshot,
        owner=object_key,
        on_change=on_change,
    )
