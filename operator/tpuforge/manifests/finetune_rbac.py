"""FineTuneJob -> the objects its pods report progress with: a Role/RoleBinding that lets the pods'
ServiceAccount (spec.serviceAccountName, the platform team's) get and patch this FineTuneJob's status.

The operator does not make the pods' identity: a ServiceAccount it owned would be deleted with the job and has no
Workload Identity binding, so its pods could not reach GCS. Only a job started before spec.serviceAccountName was
required (an operator upgrade mid-run) still gets the one made for it then, so that its next attempts start.

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
    """The Role + RoleBinding that let the pods' ServiceAccount get and patch this FineTuneJob's status, and
    nothing else (and that ServiceAccount itself only for a job started without spec.serviceAccountName)."""
    lab = labels(o, COMPONENT_RBAC)
    sa = service_account_name(o.name, spec)
    role = progress_role_name(o.name)
    objs = [] if spec.service_account_name else [service_account(o, sa, lab)]
    objs.append(own_status_role(o, role, lab, FINETUNEJOB_PLURAL, PROGRESS_VERBS))
    objs.append(role_binding(o, role, lab, role, sa))
    return objs


__all__ = ["rbac_objects"]
