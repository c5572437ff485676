"""Base model for every API type: camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Spec-side model: unknown fields are errors, so a typo never silently becomes a default."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it appears in YAML/JSON: camelCase keys, unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(ApiModel):
    """Status-side model: tolerant of keys written by newer operators or trainers."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
    )


class PodResources(ApiModel):
    """CPU and memory a pod's container asks of its node. Unset: tpuforge.api.resources derives it from what the
    pod does (docs/platform-team.md, "Requests and limits")."""

    cpu: str | None = Field(default=None, description="CPU request, e.g. 8 or 500m; unset: derived.")
    memory: str | None = Field(
        default=None, description="Memory request, e.g. 96Gi; unset: derived from the model's size."
    )


class FineTuneJobRef(ApiModel):
    name: str = Field(description="A FineTuneJob in the same namespace, by name.")
