"""Spec changes: the spec a FineTuneJob runs with. An invalid spec fails a job that has not started; after the
start, the fields that change the training maths keep the values the run started with (read back from the
newest training ConfigMap), and the SpecChangeNotApplied condition says which edits were not applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from tpuforge.api import FineTuneJobSpec, SpecError, validate_finetune
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune import events as ev
from tpuforge.controllers.finetune.children import ConfigView, clip
from tpuforge.controllers.finetune.context import Base, Ctx
from tpuforge.controllers.finetune.transitions import to_failed
from tpuforge.controllers.runtime import defaults

# Fields whose change after the start would change the training maths (or the pods' identity): later
# attempts keep the values the run started with. Wire names, as `kubectl edit` shows them.
FROZEN_FIELDS = ("model", "dataset", "lora", "training", "checkpoint", "serviceAccountName")
FROZEN_TPU_FIELDS = ("slice", "mesh")


def _leaves(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}.{k}"))
        return out
    return {path: value}


def frozen_changes(started: FineTuneJobSpec, current: FineTuneJobSpec) -> list[str]:
    """The frozen fields (leaf paths such as spec.training.learningRate) that differ from the start."""
    a, b = started.to_wire(), current.to_wire()
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for key in FROZEN_FIELDS:
        old.update(_leaves(a.get(key), f"spec.{key}"))
        new.update(_leaves(b.get(key), f"spec.{key}"))
    for key in FROZEN_TPU_FIELDS:
        old.update(_leaves(a.get("tpu", {}).get(key), f"spec.tpu.{key}"))
        new.update(_leaves(b.get("tpu", {}).get(key), f"spec.tpu.{key}"))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def effective_spec(started: FineTuneJobSpec, current: FineTuneJobSpec) -> FineTuneJobSpec:
    """The current spec with the frozen fields taken from the spec the run started with."""
    wire = current.to_wire()
    first = started.to_wire()
    for key in FROZEN_FIELDS:
        if key in first:
            wire[key] = first[key]
        else:
            wire.pop(key, None)
    tpu = dict(wire.get("tpu", {}))
    for key in FROZEN_TPU_FIELDS:
        if key in first.get("tpu", {}):
            tpu[key] = first["tpu"][key]
        else:
            tpu.pop(key, None)
    wire["tpu"] = tpu
    return FineTuneJobSpec.model_validate(wire)


def started_spec(configs: tuple[ConfigView, ...]) -> FineTuneJobSpec | None:
    """The spec the run started with, from the newest training ConfigMap that holds one."""
    for cv in sorted(configs, key=lambda c: c.attempt if c.attempt is not None else -1, reverse=True):
        if cv.spec is None:
            continue
        try:
            return FineTuneJobSpec.model_validate(cv.spec)
        except ValidationError:
            continue
    return None


def resolve(b: Base) -> Ctx | None:
    """The context the phases run with, its spec completed by the operator's defaults; None when the spec is
    invalid and the job never started (then it has failed with InvalidSpec)."""
    spec = _effective(b)
    if spec is None:
        return None
    # The default images are resolved once, when the job is first handled, and kept (status.images): an
    # operator upgrade changes no stage of a job under way.
    b.st.images = defaults.current().pinned(FineTuneJobSpec, b.st.images)
    return Ctx(b, defaults.current().apply(spec, b.st.images))


def _effective(b: Base) -> FineTuneJobSpec | None:
    started = started_spec(b.o.configs)
    try:
        valid = validate_finetune(b.o.spec, defaults.current().local_dataset_paths)
        profile = defaults.current().profile_errors(valid)
        if profile:
            raise SpecError(profile)
        current: FineTuneJobSpec | None = valid
        error: SpecError | None = None
    except SpecError as exc:
        current, error = None, exc
    if started is None:
        if current is None:
            assert error is not None
            to_failed(b, "invalid-spec", c.invalid_spec(error), ev.invalid_spec(error.fields))
        return current
    if current is None:
        assert error is not None
        not_applied(b, c.invalid_edit(error), ev.invalid_edit(error.fields))
        return started
    changed = frozen_changes(started, current)
    not_applied(b, c.frozen(changed) if changed else None, ev.frozen(changed))
    return effective_spec(started, current)


def not_applied(b: Base, message: str | None, short: str = "") -> None:
    """SpecChangeNotApplied: True with `message` (a Warning once per new message), or back to False."""
    if message is None:
        if b.has_condition(c.SPEC_CHANGE_NOT_APPLIED):
            b.condition(c.SPEC_CHANGE_NOT_APPLIED, "False", c.SPEC_MATCHES, c.SPEC_MATCHES_MESSAGE)
        return
    before = next((x for x in b.st.conditions if x.type == c.SPEC_CHANGE_NOT_APPLIED), None)
    b.condition(c.SPEC_CHANGE_NOT_APPLIED, "True", c.FROZEN_FIELDS_CHANGED, message)
    if before is None or before.status != "True" or before.message != clip(message):
        b.event("Warning", ev.SPEC_FROZEN, short)
