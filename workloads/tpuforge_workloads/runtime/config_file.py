"""Reading a pod's config file (a ConfigMap mounted as JSON, or any storage path) into its api model."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from tpuforge_workloads import storage

M = TypeVar("M", bound=BaseModel)


def read_config(model: type[M], path: str, error: type[Exception]) -> M:
    """`path` parsed as `model`; `error` (the program's bad-input error) names the file and the first problem."""
    try:
        return model.model_validate_json(storage.read_text(path))
    except storage.StorageError as e:
        raise error(f"--config {path}: cannot read it ({e})") from e
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise error(f"--config {path}: {where}: {first['msg']} ({e.error_count()} errors)") from e
