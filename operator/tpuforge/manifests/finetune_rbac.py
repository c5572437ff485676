"""FineTuneJob -> the objects its pods report progress with: their ServiceAccount (unless the spec names one)
and a Role/RoleBinding that lets it get and patch this FineTuneJob's status.

Pure: the same inputs give the same objects.
"""

from __future__ import annotations

from tpuforge.api.constants import FINETUNEJOB_PLURAL
from tpuforge.api.finetune import FineTuneJobSpec
from tpuforge.manifests.common import Obj, Owner, child_name, own_status_role, role_binding, service_account
from tpuforge.manifests.finetune_common import COMPONENT_RBAC, labels, service_account_name

PROGRESS_VERBS = ("get", "patch")


def progress_role_name(name: str) -> str:
    return child_name(name, "progress")


def rbac_objects(o: Owner, spec: FineTuneJobSpec) -> list[Obj]:
    """The pods' ServiceAccount (unless the spec names one) and the Role + RoleBinding that let it get and
    patch this FineTuneJob's status, and nothing else."""
    lab = labels(o, COMPONENT_RBAC)
    sa = service_account_name(o.name, spec)
    role = progress_role_name(o.name)
    objs = [] if spec.service_account_name else [service_account(o, sa, lab)]
    objs.append(own_status_role(o, role, lab, FINETUNEJOB_PLURAL, PROGRESS_VERBS))
    objs.append(role_binding(o, role, lab, role, sa))
    return objs


__all__ = ["rbac_objects"]
