"""Base model for every API type: camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
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
