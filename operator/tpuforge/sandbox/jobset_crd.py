"""The JobSet CustomResourceDefinition (jobset.x-k8s.io/v1alpha2, upstream v0.12.0), adapted so that the
sandbox's Kubernetes 1.20 apiserver accepts it.

GKE clusters get it from the JobSet release; the sandbox keeps the file verbatim in `upstream/` and changes,
at install time only, what 1.20 cannot hold:
- `x-kubernetes-validations` (CEL rules arrived in 1.25): dropped, so rules such as "replicatedJobs names are
  immutable" are not enforced here;
- `default: ""` on object-reference names: 1.20 checks defaults against the schema and reads an empty string
  as null; dropped (an absent name and an empty one mean the same to every consumer);
- a key of `x-kubernetes-list-map-keys` left without a default must then be required (1.20's rule for map
  lists): it is added to the item's `required` (only `imagePullSecrets[].name`, which is always given).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

JOBSET_CRD_FILE = Path(__file__).parent / "upstream" / "jobset-crd.yaml"
JOBSET_CRD_NAME = "jobsets.jobset.x-k8s.io"


def for_kubernetes_1_20(schema: Any) -> Any:
    """A copy of `schema` (any part of a CRD) without what Kubernetes 1.20 rejects; see the module doc."""
    if isinstance(schema, list):
        return [for_kubernetes_1_20(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: for_kubernetes_1_20(v)
        for k, v in schema.items()
        if k != "x-kubernetes-validations" and not (k == "default" and v == "")
    }
    items = out.get("items")
    for key in out.get("x-kubernetes-list-map-keys") or []:
        if isinstance(items, dict) and "default" not in items["properties"][key]:
            required = items.setdefault("required", [])
            if key not in required:
                required.append(key)
    return out


def jobset_crd() -> dict[str, Any]:
    """The JobSet CRD as the sandbox installs it."""
    crd: dict[str, Any] = for_kubernetes_1_20(yaml.safe_load(JOBSET_CRD_FILE.read_text()))
    return crd
